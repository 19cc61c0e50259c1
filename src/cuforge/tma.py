"""TMA descriptors and driver launches: what cuda.core does not marshal. `tma_2d` encodes a
CUtensorMap on the host (cached by address, shape and box); kernels that take one by value are
launched through the driver's cuLaunchKernel with each argument's bytes laid out as the kernel
expects."""

from __future__ import annotations

import collections
import ctypes
from typing import Any

import numpy as np

from cuforge.cuda_stream import current_stream_handle


class LaunchError(RuntimeError):
    """A kernel launch the driver refused (runtime.py raises it too and exports it under its name)."""


class TensorMap:
    """A CUtensorMap (TMA descriptor) encoded on the host: 128 bytes at a 64-byte aligned address
    (`address`), passed by value to a kernel parameter declared as such a struct."""

    def __init__(self, buffer: Any, address: int) -> None:
        self.buffer, self.address = buffer, address

    @property
    def raw(self) -> bytes:
        return ctypes.string_at(self.address, 128)


_TMA_DTYPES = {"float16": 6, "bfloat16": 9, "float32": 7, "float64": 8, "int32": 3, "uint8": 0, "int64": 5}
_TMA_SWIZZLE = {0: 0, 32: 1, 64: 2, 128: 3}
_LIBCUDA: Any = None
_NUMPY_TO_CTYPES: dict[str, Any] = {}


def _init_numpy_ctypes() -> None:
    for np_t, c_t in ((np.uint64, ctypes.c_uint64), (np.int64, ctypes.c_int64), (np.int32, ctypes.c_int32),
                      (np.uint32, ctypes.c_uint32), (np.int16, ctypes.c_int16), (np.uint16, ctypes.c_uint16),
                      (np.int8, ctypes.c_int8), (np.uint8, ctypes.c_uint8), (np.float32, ctypes.c_float),
                      (np.float64, ctypes.c_double), (np.bool_, ctypes.c_bool)):
        _NUMPY_TO_CTYPES[np.dtype(np_t).str] = lambda v, c_t=c_t: c_t(v.item())
    _NUMPY_TO_CTYPES[np.dtype(np.float16).str] = lambda v: ctypes.c_uint16(int(np.asarray(v).view(np.uint16)))


_init_numpy_ctypes()
# Descriptors by (address, shape, dtype, box): encoding costs microseconds of host time per call.
_TMA_CACHE: collections.OrderedDict[tuple[Any, ...], TensorMap] = collections.OrderedDict()


def _libcuda() -> Any:
    global _LIBCUDA
    if _LIBCUDA is None:
        _LIBCUDA = ctypes.CDLL("libcuda.so.1")
    return _LIBCUDA


def _encode(tensor: Any, dtype: str, shape: tuple[int, ...], box: tuple[int, ...], element_strides: tuple[int, ...],
            swizzle: int, what: str) -> TensorMap:
    """The cached descriptor of a contiguous tensor seen as `shape` (innermost first), or a new one."""
    key = (tensor.data_ptr(), shape, dtype, box, element_strides, swizzle, tensor.device.index)
    cached = _TMA_CACHE.get(key)
    if cached is not None:
        _TMA_CACHE.move_to_end(key)
        return cached
    elem = tensor.element_size()
    if (shape[0] * elem) % 16 or tensor.data_ptr() % 16:
        raise LaunchError(f"{what}: rows of {shape[0] * elem} bytes (and the base address) must be multiples of 16")
    buf = ctypes.create_string_buffer(128 + 64)
    addr = (ctypes.addressof(buf) + 63) & ~63
    rank = len(shape)
    pitches, pitch = [], elem
    for d in shape[:-1]:
        pitch *= d
        pitches.append(pitch)
    err = _libcuda().cuTensorMapEncodeTiled(
        ctypes.c_void_p(addr), _TMA_DTYPES[dtype], rank, ctypes.c_void_p(tensor.data_ptr()), (ctypes.c_uint64 * rank)(*shape),
        (ctypes.c_uint64 * max(rank - 1, 1))(*(pitches or [0])), (ctypes.c_uint32 * rank)(*box),
        (ctypes.c_uint32 * rank)(*element_strides), 0, _TMA_SWIZZLE[swizzle], 3, 0)
    if err:
        raise LaunchError(f"cuTensorMapEncodeTiled failed (CUresult {err}) for a {dtype} tensor of dims {list(shape)} "
                            f"(innermost first), box {list(box)}, element strides {list(element_strides)}, swizzle {swizzle}")
    _TMA_CACHE[key] = tmap = TensorMap(buf, addr)
    if len(_TMA_CACHE) > 256:
        _TMA_CACHE.popitem(last=False)
    return tmap


def _dtype(tensor: Any, swizzle: int, what: str) -> str:
    dtype = str(tensor.dtype).removeprefix("torch.")
    if dtype not in _TMA_DTYPES or swizzle not in _TMA_SWIZZLE:
        raise LaunchError(f"{what}: unsupported dtype {dtype} or swizzle {swizzle}")
    return dtype


def tma_2d(tensor: Any, box_inner: int, box_outer: int, swizzle: int = 128) -> TensorMap:
    """A TMA descriptor over a contiguous CUDA tensor seen as rows of its last dim (a 3-D batch of
    matrices is one tall matrix): tiles of box_outer rows x box_inner elements, shared-memory swizzle
    of `swizzle` bytes, zero fill past the tensor's edges."""
    if not getattr(tensor, "is_cuda", False) or tensor.dim() < 2 or not tensor.is_contiguous():
        raise LaunchError("tma_2d needs a contiguous CUDA tensor of 2 or more dims")
    dtype = _dtype(tensor, swizzle, "tma_2d")
    cols = tensor.shape[-1]
    rows = tensor.numel() // cols if cols else 0
    return _encode(tensor, dtype, (cols, rows), (box_inner, box_outer), (1, 1), swizzle, "tma_2d")


def tma_nd(tensor: Any, box: tuple[int, ...], element_strides: tuple[int, ...] = (), swizzle: int = 128,
           view: tuple[int, ...] = ()) -> TensorMap:
    """A TMA descriptor over all dims of a contiguous CUDA tensor (up to 5): `box` and
    `element_strides` list the dims innermost first, as the hardware does. A stride s > 1 loads every
    s-th element of box[i] (ceil(box[i] / s) of them): a strided convolution's window. Coordinates
    may run past either edge (negative too): those elements load as zero, a convolution's padding.
    `view` reshapes the tensor first (outermost first, as torch's view), here rather than in the launch
    expression: launch expressions run without builtins, and torch's view of a CUDA tensor may import."""
    if not getattr(tensor, "is_cuda", False) or not tensor.is_contiguous():
        raise LaunchError("tma_nd needs a contiguous CUDA tensor of 1 to 5 dims")
    if view:
        tensor = tensor.view(*view)  # of a contiguous tensor: contiguous
    if not 1 <= tensor.dim() <= 5:
        raise LaunchError("tma_nd needs a contiguous CUDA tensor of 1 to 5 dims")
    rank = tensor.dim()
    strides = tuple(element_strides) or (1,) * rank
    if len(box) != rank or len(strides) != rank:
        raise LaunchError(f"tma_nd: a box and element strides of {rank} dims for a {rank}-D tensor, not {box} and {strides}")
    if not all(1 <= b <= 256 for b in box) or not all(1 <= x <= 8 for x in strides):
        raise LaunchError(f"tma_nd: box dims run 1 to 256 and element strides 1 to 8, not {box} and {strides}")
    dtype = _dtype(tensor, swizzle, "tma_nd")
    return _encode(tensor, dtype, tuple(reversed(tensor.shape)), tuple(box), strides, swizzle, "tma_nd")


def function_handle(handle: Any, name: str) -> int:
    """A CUfunction (as an int) for cuLaunchKernel, from cuda.core's kernel handle."""
    from cuda.bindings import driver

    if type(handle).__name__ == "CUkernel":
        err, handle = driver.cuKernelGetFunction(handle)
        if int(err) != 0:
            raise LaunchError(f"{name}: cuKernelGetFunction failed ({err})")
    return int(handle)


def launch_through_driver(function: int, name: str, grid: tuple[int, ...], block: tuple[int, ...], shared_mem: int,
                          args: tuple[Any, ...]) -> None:
    """cuLaunchKernel on torch's current stream; args are TensorMaps or numpy scalars (pointers as uint64)."""
    holders: list[Any] = []
    addresses = []
    for a in args:
        if isinstance(a, TensorMap):
            addresses.append(a.address)  # cuLaunchKernel copies the 128 bytes at launch
        else:
            c = _NUMPY_TO_CTYPES[(a.dtype if isinstance(a, np.generic) else np.asarray(a).dtype).str](a)
            holders.append(c)
            addresses.append(ctypes.addressof(c))
    params = (ctypes.c_void_p * len(addresses))(*addresses)
    g, b = (tuple(grid) + (1, 1))[:3], (tuple(block) + (1, 1))[:3]
    stream = current_stream_handle()
    err = _libcuda().cuLaunchKernel(ctypes.c_void_p(function), *(ctypes.c_uint(x) for x in g),
                                    *(ctypes.c_uint(x) for x in b), ctypes.c_uint(shared_mem),
                                    ctypes.c_void_p(stream), params, None)
    if err:
        raise LaunchError(f"{name}: cuLaunchKernel failed (CUresult {err})")
