"""The wire between the judge and a candidate host: framed messages on a Unix socket, and tensors
described on it - CUDA tensors as IPC handles (no copy), CPU tensors as raw bytes.

Nothing crossing it is pickled: the judge reads a host's messages as JSON and bytes only, bounds
their sizes, and checks a CUDA tensor a host describes against the allocation it really maps.
"""

from __future__ import annotations

import base64
import ctypes
import gc
import json
import select
import socket
import struct
import time
import weakref
from collections.abc import Sequence
from typing import Any

import torch

_HEAD = struct.Struct("!II")  # JSON length, number of binary parts
_PART = struct.Struct("!Q")
MAX_JSON = 16 * 2**20

DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16, torch.int8,
    torch.uint8, torch.bool, torch.complex64, torch.complex128)}


class WireError(RuntimeError):
    """The peer broke the protocol, went away, or took too long."""


class PeerTimeout(WireError):
    pass


class PeerGone(WireError):
    pass


class Channel:
    """One end of the socket. `recv` enforces a deadline and a byte budget: a host is untrusted."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sock.setblocking(True)

    def send(self, header: dict[str, Any], parts: Sequence[bytes | memoryview] = ()) -> None:
        data = json.dumps(header).encode()
        try:
            self.sock.sendall(_HEAD.pack(len(data), len(parts)) + data)
            for p in parts:
                self.sock.sendall(_PART.pack(len(p)))
                self.sock.sendall(p)
        except OSError as e:
            raise PeerGone(f"the peer closed the connection ({e.strerror or e})") from None

    def recv(self, timeout_s: float | None = None, max_bytes: int = 2**40) -> tuple[dict[str, Any], list[bytes]]:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        n_json, n_parts = _HEAD.unpack(self._exact(_HEAD.size, deadline))
        if n_json > MAX_JSON or n_parts > 4096:
            raise WireError(f"a message of {n_json} bytes and {n_parts} parts is beyond the protocol's bounds")
        try:
            header = json.loads(self._exact(n_json, deadline))
        except ValueError:
            raise WireError("a message that is not JSON") from None
        if not isinstance(header, dict):
            raise WireError("a message that is not a JSON object")
        parts, total = [], 0
        for _ in range(n_parts):
            (n,) = _PART.unpack(self._exact(_PART.size, deadline))
            total += n
            if total > max_bytes:
                raise WireError(f"binary parts of more than {max_bytes} bytes")
            parts.append(self._exact(n, deadline))
        return header, parts

    def _exact(self, n: int, deadline: float | None) -> bytes:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                    raise PeerTimeout("no reply in time")
            try:
                k = self.sock.recv_into(view[got:], min(n - got, 1 << 24))
            except OSError as e:
                raise PeerGone(f"the connection broke ({e.strerror or e})") from None
            if k == 0:
                raise PeerGone("the peer closed the connection")
            got += k
        return bytes(buf)

    def close(self) -> None:
        self.sock.close()


# ------------------------------------------------------------------------------------------- tensors

def _b64(b: bytes | None) -> str | None:
    return None if b is None else base64.b64encode(b).decode()


def _unb64(s: Any) -> bytes | None:
    return None if s is None else base64.b64decode(str(s))


def describe(value: Any, parts: list[bytes]) -> dict[str, Any]:
    """A value for the wire: CUDA tensors by IPC handle of their allocation (no copy), CPU tensors
    by bytes appended to `parts`, numbers as themselves."""
    if not isinstance(value, torch.Tensor):
        if value is None or isinstance(value, (bool, int, float, str)):
            return {"value": value}
        raise WireError(f"a {type(value).__name__} cannot cross to the other process")
    t = value.detach()
    base = {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
    if t.device.type == "cuda":
        if t.numel() == 0:
            return {**base, "empty": True}
        start, size = driver().address_range(t.data_ptr())
        first = t.data_ptr() - start
        return {**base, "stride": list(t.stride()), "ipc": _b64(driver().ipc_handle(start)), "bytes": size,
                "first": first}
    parts.append(t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return {**base, "part": len(parts) - 1}


def materialize(desc: Any, parts: list[bytes], device: torch.device, mappings: Mappings | None = None) -> Any:
    """The value a description stands for. Every field is checked: a bad one is a WireError."""
    if not isinstance(desc, dict):
        raise WireError("a value description that is not an object")
    if "value" in desc:
        v = desc["value"]
        if v is not None and not isinstance(v, (bool, int, float, str)):
            raise WireError("a plain value of an unknown kind")
        return v
    dtype = DTYPES.get(str(desc.get("dtype")))
    shape = desc.get("shape")
    if dtype is None or not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise WireError(f"a tensor of dtype {desc.get('dtype')!r} and shape {shape!r}")
    numel = 1
    for s in shape:
        numel *= s
    size = torch.empty((), dtype=dtype).element_size()
    if desc.get("empty"):
        if numel:
            raise WireError("an empty CUDA tensor of a non-empty shape")
        return torch.empty(shape, dtype=dtype, device=device)
    if "part" in desc:
        k = desc["part"]
        if not isinstance(k, int) or not 0 <= k < len(parts) or len(parts[k]) != numel * size:
            raise WireError(f"a CPU tensor of shape {shape} whose bytes do not match it")
        flat = torch.frombuffer(bytearray(parts[k]), dtype=torch.uint8) if numel else torch.empty(0, dtype=torch.uint8)
        return flat.view(dtype).reshape(shape).to(device)
    if mappings is None:
        raise WireError("a CUDA tensor where none was expected")
    return mappings.tensor(desc, dtype, shape, numel, size)


class _Raw:
    """A device address range as __cuda_array_interface__ bytes, for torch.as_tensor (no copy)."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3,
                                         "strides": None}


class Mappings:
    """The other process's allocations this process has opened, by IPC handle, each opened once. Every
    tensor over one holds a token of it (its __cuda_array_interface__ object, which torch keeps), so
    `close` knows without a full garbage collection which are no longer used."""

    def __init__(self) -> None:
        self.opened: dict[bytes, tuple[int, int]] = {}  # handle -> (base address here, bytes)
        self.holders: dict[bytes, weakref.WeakSet[_Raw]] = {}

    def tensor(self, desc: dict[str, Any], dtype: torch.dtype, shape: list[int], numel: int, size: int) -> torch.Tensor:
        handle, nbytes, first, stride = _unb64(desc.get("ipc")), desc.get("bytes"), desc.get("first"), desc.get("stride")
        if (handle is None or len(handle) != 64 or not isinstance(nbytes, int) or not isinstance(first, int)
                or not isinstance(stride, list) or len(stride) != len(shape)
                or not all(isinstance(s, int) and s >= 0 for s in stride) or first < 0 or first % size):
            raise WireError("a CUDA tensor description with missing or bad fields")
        extent = (1 + sum((n - 1) * s for n, s in zip(shape, stride))) * size
        if handle not in self.opened:
            base = driver().ipc_open(handle)
            _, mapped = driver().address_range(base)
            self.opened[handle] = (base, mapped)
            self.holders[handle] = weakref.WeakSet()
        base, mapped = self.opened[handle]
        if first + extent > mapped:
            raise WireError(f"a tensor reaching {first + extent} bytes into an allocation of {mapped}")
        token = _Raw(base + first, extent)
        self.holders[handle].add(token)
        raw = torch.as_tensor(token, device="cuda")
        return raw.view(dtype).as_strided(tuple(shape), tuple(stride))

    def in_use(self) -> int:
        return sum(1 for held in self.holders.values() if len(held))

    def close(self) -> None:
        """Once the peer's work is over: unmap every allocation no tensor here still uses, after the
        device has finished with them. One still used (a reference cycle) costs a garbage collection;
        one still used after it stays mapped until a later close finds it free."""
        if self.in_use():
            gc.collect()
        torch.cuda.synchronize()
        if self not in _STILL_MAPPED:
            _STILL_MAPPED.append(self)
        for mappings in _STILL_MAPPED:
            mappings._unmap_unused()
        _STILL_MAPPED[:] = [m for m in _STILL_MAPPED if m.opened]

    def _unmap_unused(self) -> None:
        for handle in [h for h, held in self.holders.items() if not len(held)]:
            driver().ipc_close(self.opened.pop(handle)[0])
            del self.holders[handle]


_STILL_MAPPED: list[Mappings] = []


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


class _Driver:
    """The four CUDA driver calls legacy IPC needs, on the context torch made current."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.lib.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), _Handle, ctypes.c_uint]

    def _ok(self, rc: int, what: str) -> None:
        if rc != 0:
            raise WireError(f"{what} failed (CUDA driver error {rc})")

    def address_range(self, ptr: int) -> tuple[int, int]:
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        self._ok(self.lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr)),
                 "cuMemGetAddressRange")
        return base.value, size.value

    def ipc_handle(self, base: int) -> bytes:
        h = _Handle()
        self._ok(self.lib.cuIpcGetMemHandle(ctypes.byref(h), ctypes.c_uint64(base)), "cuIpcGetMemHandle")
        return ctypes.string_at(ctypes.addressof(h), 64)

    def ipc_open(self, handle: bytes) -> int:
        h = _Handle()
        ctypes.memmove(ctypes.addressof(h), handle, 64)
        ptr = ctypes.c_uint64()
        self._ok(self.lib.cuIpcOpenMemHandle_v2(ctypes.byref(ptr), h, 1), "cuIpcOpenMemHandle")  # lazy peer access
        return ptr.value

    def ipc_close(self, base: int) -> None:
        self.lib.cuIpcCloseMemHandle(ctypes.c_uint64(base))


_DRIVER: _Driver | None = None


def driver() -> _Driver:
    global _DRIVER
    if _DRIVER is None:
        _DRIVER = _Driver()
    return _DRIVER
