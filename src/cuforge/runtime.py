"""The fast runtime: CUDA C++ -> cubin with NVRTC (through cuda.core), cached, launched on torch tensors.

    from cuforge.runtime import compile_cuda
    mod = compile_cuda(SOURCE)                 # NVRTC, exact arch of the current GPU (sm_90a on Hopper)
    k = mod.kernel("my_kernel")                # extern "C" name, or a C++ name expression
    k((grid_x, grid_y), (256,), A, B, C, M, N, K, shared_mem=0)   # on torch's current stream

Compilation needs no GPU (give `arch`); loading and launching do. Cubins are cached by
(source, options, arch, NVRTC version) in memory and on disk. Compile errors raise CompileError
carrying structured diagnostics. Scalars are converted to the C type the kernel's signature names.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cuforge.cuda_stream import current_stream_handle
from cuforge.diagnostics import Diagnostic
from cuforge.kernel_args import Param, by_value_struct, converter, kernel_signatures
from cuforge.tma import LaunchError, TensorMap, function_handle, launch_through_driver

_LOCK = threading.Lock()
_MEMORY_CACHE: dict[str, bytes] = {}
_LOADED: dict[str, Any] = {}  # cache key -> cuda.core ObjectCode
# Cubins compiled ahead in another process and handed to this one (seed_cubin), and those of them a
# compile has since found: how an evaluation tells that its kernels came built.
_SEEDED: set[str] = set()
_SEEDED_FOUND: set[str] = set()
_STREAMS: dict[int, Any] = {}
# Every kernel launched through this runtime in this process, for profiles: name -> KernelRecord.
LAUNCHED: dict[str, KernelRecord] = {}


class CompileError(RuntimeError):
    def __init__(self, message: str, diagnostics: list[Diagnostic], log: str) -> None:
        super().__init__(message)
        self.diagnostics = diagnostics
        self.log = log


@dataclass
class KernelRecord:
    name: str
    registers: int | None = None
    shared_static_bytes: int | None = None
    local_bytes: int | None = None
    max_threads_per_block: int | None = None
    launches: int = 0
    last_dynamic_shared: int = 0
    last_block: tuple[int, ...] = ()
    last_grid: tuple[int, ...] = ()


@dataclass(frozen=True)
class CompileStats:
    seconds: float
    cache: str  # "memory", "disk" or "miss"


# ---------------------------------------------------------------------------------- compile

def nvrtc_version() -> str:
    from cuda.bindings import nvrtc

    _err, major, minor = nvrtc.nvrtcVersion()
    return f"{major}.{minor}"


@dataclass
class RuntimeSettings:
    """How this process's runtime works, set by the process that owns it (configure), never read back
    from the environment: compile-only workers and hosts compile for a named arch and launch nothing."""

    compile_only: bool = False
    arch: str | None = None


SETTINGS = RuntimeSettings()


def configure(compile_only: bool = False, arch: str | None = None) -> None:
    SETTINGS.compile_only, SETTINGS.arch = compile_only, arch


def current_arch() -> str:
    """sm_XY of torch's current device, with the 'a' suffix on Hopper so wgmma/setmaxnreg work."""
    if SETTINGS.arch:  # compile-only workers name the target arch
        return SETTINGS.arch
    import torch

    major, minor = torch.cuda.get_device_capability()
    return sm_arch(major, minor)


def sm_arch(major: int, minor: int) -> str:
    """The arch a GPU of compute capability major.minor compiles for: sm_XY, sm_90a on Hopper."""
    return f"sm_{major}{minor}" + ("a" if (major, minor) == (9, 0) else "")


def cuda_include_dirs() -> list[str]:
    dirs: list[str] = []
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            dirs.append(os.path.join(os.environ[env], "include"))
    dirs += ["/usr/local/cuda/include"]
    try:
        from cuda.pathfinder import find_nvidia_header_directory

        found = find_nvidia_header_directory("cudart")
        if found:
            dirs.append(str(found))
    except Exception:  # noqa: BLE001 - optional discovery
        pass
    return [d for d in dict.fromkeys(dirs) if os.path.isfile(os.path.join(d, "cuda_fp16.h"))]


def cubin_cache_dir() -> Path:
    from cuforge.problems.loader import cache_dir

    return cache_dir() / "cubins"


def _cache_key(source: str, options: tuple[str, ...], arch: str, name_expressions: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for part in (source, "\0".join(options), arch, "\0".join(name_expressions), nvrtc_version()):
        h.update(part.encode())
        h.update(b"\1")
    return h.hexdigest()


_DIAG = re.compile(r"^(?P<file>[^\s(]+)\((?P<line>\d+)\): (?P<sev>error|warning|catastrophic error)[^:]*: (?P<msg>.*)$")


def parse_diagnostics(log: str) -> list[Diagnostic]:
    """NVRTC's log -> diagnostics; the caret line under the echoed source gives the column."""
    lines = log.splitlines()
    out: list[Diagnostic] = []
    for i, line in enumerate(lines):
        m = _DIAG.match(line.strip())
        if not m:
            continue
        column = None
        if i + 2 < len(lines) and lines[i + 2].strip() == "^":
            column = len(lines[i + 2]) - len(lines[i + 2].lstrip()) + 1 - 2  # NVRTC indents echoed source by 2
            column = max(column, 1)
        sev = "error" if "error" in m.group("sev") else "warning"
        out.append(Diagnostic(int(m.group("line")), column, sev, m.group("msg").strip()))
    return out


def _nvrtc_options(options: tuple[str, ...], arch: str) -> tuple[Any, tuple[str, ...]]:
    from cuda.core import ProgramOptions

    extra = tuple(options)
    opts = ProgramOptions(
        arch=arch,
        std="c++17",
        include_path=cuda_include_dirs() or None,
        use_fast_math=False,
        device_int128=False,
    )
    return opts, extra


def compile_to_cubin(
    source: str,
    arch: str,
    options: tuple[str, ...] = (),
    name_expressions: tuple[str, ...] = (),
) -> tuple[bytes, dict[str, str], CompileStats]:
    """Compile once; later calls with the same inputs return the cached cubin."""
    t0 = time.perf_counter()
    key = _cache_key(source, options, arch, name_expressions)
    with _LOCK:
        if key in _MEMORY_CACHE:
            if key in _SEEDED:
                _SEEDED_FOUND.add(key)
            return _MEMORY_CACHE[key], _read_mapping(key), CompileStats(time.perf_counter() - t0, "memory")
    path = cubin_cache_dir() / f"{key}.cubin"
    if path.exists():
        data = path.read_bytes()
        with _LOCK:
            _MEMORY_CACHE[key] = data
        return data, _read_mapping(key), CompileStats(time.perf_counter() - t0, "disk")
    from cuda.core import Program

    opts, extra = _nvrtc_options(options, arch)
    if extra:
        opts = _with_extra(opts, extra)
    try:
        program = Program(source, code_type="c++", options=opts)
        obj = program.compile("cubin", name_expressions=name_expressions or ())
    except Exception as e:  # noqa: BLE001 - NVRTC errors come as several exception types
        log = str(e)
        diags = parse_diagnostics(log)
        first = next((d for d in diags if d.severity == "error"), None)
        raise CompileError(f"NVRTC: {first}" if first else f"NVRTC: {log.strip().splitlines()[-1] if log.strip() else type(e).__name__}", diags, log) from None
    data = bytes(obj.code)
    mapping = {k if isinstance(k, str) else k.decode(): v if isinstance(v, str) else v.decode()
               for k, v in (getattr(obj, "symbol_mapping", None) or {}).items()}
    _store(key, path, data, mapping)
    return data, mapping, CompileStats(time.perf_counter() - t0, "miss")


def _with_extra(opts: Any, extra: tuple[str, ...]) -> Any:
    """Map the few nvcc-style flags candidates commonly pass onto ProgramOptions fields."""
    for flag in extra:
        if flag in ("-use_fast_math", "--use_fast_math"):
            opts.use_fast_math = True
        elif flag.startswith("-maxrregcount=") or flag.startswith("--maxrregcount="):
            opts.max_register_count = int(flag.split("=", 1)[1])
        elif flag.startswith("-D"):
            name, _, value = flag[2:].partition("=")
            defs = list(opts.define_macro or []) if isinstance(opts.define_macro, (list, tuple)) else (
                [opts.define_macro] if opts.define_macro else [])
            defs.append((name, value) if value else name)
            opts.define_macro = defs
        elif flag in ("-lineinfo", "--generate-line-info"):
            opts.lineinfo = True
        elif flag.startswith(("-Ofast-compile=", "--Ofast-compile=")):
            level = flag.split("=", 1)[1]
            if level not in ("0", "min", "mid", "max"):
                raise CompileError(f"unsupported compile option {flag!r}: -Ofast-compile takes 0, min, mid or max", [], "")
            opts.ofast_compile = level
        elif flag.startswith("-O") or flag == "--std=c++17" or flag == "-std=c++17":
            continue
        else:
            raise CompileError(f"unsupported compile option {flag!r}", [], "")
    return opts


def cubin_key(source: str, options: tuple[str, ...] | list[str], arch: str,
              name_expressions: tuple[str, ...] | list[str] = ()) -> str:
    """The cache key compile_cuda files this compilation under."""
    return _cache_key(source, tuple(options), arch, tuple(name_expressions))


def seed_cubin(key: str, data: bytes, mapping: dict[str, str]) -> None:
    """Put a cubin compiled elsewhere (a compile-only worker, for this process's next candidate) in
    the cache under its key: the compile that asks for that key loads it instead of running NVRTC."""
    _store(key, cubin_cache_dir() / f"{key}.cubin", data, mapping)
    with _LOCK:
        _SEEDED.add(key)


def take_seeded_found() -> int:
    """How many seeded cubins a compile has found since the last call (and forget them)."""
    with _LOCK:
        n = len(_SEEDED_FOUND)
        _SEEDED.difference_update(_SEEDED_FOUND)
        _SEEDED_FOUND.clear()
    return n


def _mapping_path(key: str) -> Path:
    return cubin_cache_dir() / f"{key}.names"


def _read_mapping(key: str) -> dict[str, str]:
    p = _mapping_path(key)
    if not p.exists():
        return {}
    pairs = [line.split("\t", 1) for line in p.read_text().splitlines() if "\t" in line]
    return {a: b for a, b in pairs}


def _store(key: str, path: Path, data: bytes, mapping: dict[str, str]) -> None:
    with _LOCK:
        _MEMORY_CACHE[key] = data
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if mapping:  # whole or not at all, as the cubin: processes sharing a cache read it as another writes
            names = Path(f"{_mapping_path(key)}.tmp{os.getpid()}")
            names.write_text("".join(f"{a}\t{b}\n" for a, b in mapping.items()))
            names.replace(_mapping_path(key))
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(data)
        tmp.replace(path)
    except OSError:
        pass  # an unwritable cache costs time, not correctness


# ---------------------------------------------------------------------------------- load and launch

class _TorchStream:
    """Adapts a torch stream to the __cuda_stream__ protocol that cuda.core accepts."""

    def __init__(self, handle: int) -> None:
        self._handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self._handle)


def _torch_stream() -> Any:
    handle = current_stream_handle()
    stream = _STREAMS.get(handle)
    if stream is None:
        import torch
        from cuda.core import Device

        stream = _STREAMS[handle] = Device(torch.cuda.current_device()).create_stream(_TorchStream(handle))
    return stream


def _ensure_context() -> None:
    import torch
    from cuda.core import Device

    torch.cuda.init()
    Device(torch.cuda.current_device()).set_current()


class CudaKernel:
    """A loaded kernel, callable as k(grid, block, *args, shared_mem=0) on torch's current stream."""

    def __init__(self, kernel: Any, name: str, params: list[Param] | None) -> None:
        self._kernel = kernel
        self.name = name
        self.params = params
        self._cluster_checked = False
        self._function: int | None = None  # CUfunction for driver launches, resolved once
        # A LaunchConfig costs tens of microseconds to build, more than many kernels take to run; a
        # kernel launched in a loop (a network's stages, a timing) reuses the one for its geometry.
        self._configs: dict[tuple[Any, ...], Any] = {}
        self._converters = None if params is None else [converter(p) for p in params]
        # Whether an argument can be a tensor map (launched through the driver): checked per launch only
        # for a kernel whose signature is unknown or has a by-value struct.
        self._maybe_struct = params is None or any(by_value_struct(p) for p in params)
        from cuda.core import launch

        self._launch = launch
        attrs = kernel.attributes
        # Without the opt-in, static and dynamic shared memory together stay within 48 KB: a 33 KB static
        # histogram leaves 15 KB of dynamic, however much the device has.
        self._max_dynamic_shared = max(0, 48 * 1024 - attrs.shared_size_bytes)
        self.record = LAUNCHED.setdefault(name, KernelRecord(name))
        self.record.registers = attrs.num_regs
        self.record.shared_static_bytes = attrs.shared_size_bytes
        self.record.local_bytes = attrs.local_size_bytes
        self.record.max_threads_per_block = attrs.max_threads_per_block

    def _attribute(self, attr: Any, value: int | None = None) -> int:
        """Reads (value None) or sets one of the kernel's function attributes on the current device."""
        from cuda.bindings import driver

        handle = self._kernel.handle
        if type(handle).__name__ == "CUkernel":
            import torch

            err, dev = driver.cuDeviceGet(torch.cuda.current_device())
            if value is None:
                err, got = driver.cuKernelGetAttribute(attr, handle, dev)
            else:
                (err,), got = driver.cuKernelSetAttribute(attr, value, handle, dev), value
        elif value is None:
            err, got = driver.cuFuncGetAttribute(attr, handle)
        else:
            (err,), got = driver.cuFuncSetAttribute(handle, attr, value), value
        if int(err) != 0:
            raise LaunchError(f"{self.name}: cannot {'read' if value is None else 'set'} {attr.name} ({err})")
        return int(got)

    def _allow_dynamic_shared(self, nbytes: int) -> None:
        from cuda.bindings import driver

        self._attribute(driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes)
        self._max_dynamic_shared = nbytes

    def _allow_compiled_cluster(self) -> None:
        """A kernel compiled with __cluster_dims__ over 8 blocks (Hopper schedules up to 16) launches only
        once non-portable cluster sizes are allowed for it."""
        from cuda.bindings import driver

        a = driver.CUfunction_attribute
        self._cluster_checked = True
        size = 1
        try:
            for dim in (a.CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH, a.CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT,
                        a.CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH):
                size *= max(1, self._attribute(dim))
        except LaunchError:
            return  # a driver or GPU without clusters: nothing to allow (a cluster kernel fails at its launch)
        if size > 8:
            self._attribute(a.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)

    def __call__(self, grid: Any, block: Any, *args: Any, shared_mem: int = 0, cluster: Any = None,
                 cooperative: bool = False) -> None:
        """Launch on torch's current stream. cooperative: every block resident at once (the driver refuses
        a grid that cannot be), for kernels whose blocks wait on each other."""
        if self.params is not None:
            if len(args) != len(self.params):
                raise LaunchError(f"{self.name} takes {len(self.params)} arguments, got {len(args)}")
            args = tuple(c(a) for c, a in zip(self._converters, args))  # type: ignore[arg-type]
        if shared_mem > self._max_dynamic_shared:
            self._allow_dynamic_shared(shared_mem)
        if not self._cluster_checked:
            self._allow_compiled_cluster()
        grid_t = tuple(grid) if isinstance(grid, (tuple, list)) else (int(grid),)
        block_t = tuple(block) if isinstance(block, (tuple, list)) else (int(block),)
        if self._maybe_struct and any(isinstance(a, TensorMap) for a in args):
            if cooperative:
                raise LaunchError(f"{self.name}: a cooperative launch with tensor-map arguments is not supported")
            self._launch_with_structs(grid_t, block_t, int(shared_mem), args)
        else:
            key = (grid_t, block_t, int(shared_mem), tuple(cluster) if cluster else None, bool(cooperative))
            config = self._configs.get(key)
            if config is None:
                if len(self._configs) >= 64:  # a kernel launched over many geometries keeps the latest
                    self._configs.clear()
                config = self._configs[key] = launch_config(grid_t, block_t, int(shared_mem), cluster, cooperative)
            self._launch(_torch_stream(), config, self._kernel, *args)
        rec = self.record
        rec.launches += 1
        rec.last_dynamic_shared, rec.last_block, rec.last_grid = int(shared_mem), block_t, grid_t


    def _launch_with_structs(self, grid: tuple[int, ...], block: tuple[int, ...], shared_mem: int,
                             args: tuple[Any, ...]) -> None:
        if self._function is None:
            self._function = function_handle(self._kernel.handle, self.name)
        launch_through_driver(self._function, self.name, grid, block, shared_mem, args)


def launch_config(grid: tuple[int, ...], block: tuple[int, ...], shared_mem: int, cluster: Any, cooperative: bool) -> Any:
    from cuda.core import LaunchConfig

    kw: dict[str, Any] = {"grid": grid, "block": block, "shmem_size": shared_mem}
    if cluster:
        kw["cluster"] = tuple(cluster)
    if not cooperative:
        return LaunchConfig(**kw)
    try:  # the keyword's name changed between cuda.core releases
        return LaunchConfig(**kw, is_cooperative=True)
    except TypeError:
        return LaunchConfig(**kw, cooperative_launch=True)


@dataclass(frozen=True)
class UnlaunchableKernel:
    """What `kernel()` gives in a compile-only run: the cubin was built, nothing can be launched."""

    name: str

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        raise LaunchError(f"{self.name}: compile-only run, kernels are compiled but never launched")


@dataclass
class CudaModule:
    source: str
    arch: str
    cubin: bytes
    symbol_mapping: dict[str, str]
    stats: CompileStats
    key: str
    signatures: dict[str, list[Param]] = field(default_factory=dict)

    def kernel(self, name: str) -> CudaKernel | UnlaunchableKernel:
        if SETTINGS.compile_only:
            if name not in self.signatures and name not in self.symbol_mapping:
                known = ", ".join(self.signatures) or "none found"
                raise LaunchError(f"no kernel {name!r} in module (extern \"C\" kernels: {known})")
            return UnlaunchableKernel(name)
        _ensure_context()
        from cuda.core import ObjectCode

        obj = _LOADED.get(self.key)
        if obj is None:
            obj = ObjectCode.from_cubin(self.cubin, symbol_mapping=self.symbol_mapping or None)
            _LOADED[self.key] = obj
        try:
            k = obj.get_kernel(name)
        except Exception as e:  # noqa: BLE001
            known = ", ".join(self.signatures) or "none found"
            raise LaunchError(f"no kernel {name!r} in module (extern \"C\" kernels: {known}): {e}") from None
        return CudaKernel(k, name, self.signatures.get(name))


# Threads compiling one candidate's kernels at once: NVRTC releases the GIL, and a partition of a
# network names dozens of distinct kernels (ResNet-101's: 36), each 0.2-1.6 s to compile alone.
COMPILE_THREADS = 16


def compile_many(kernels: list[tuple[str, tuple[str, ...], tuple[str, ...]]], arch: str | None = None,
                 threads: int | None = None) -> int:
    """Compile the distinct (source, options, name expressions) not yet cached, on `threads` at once
    (default: the CPUs, at most COMPILE_THREADS), so the compiles that follow one by one find them;
    how many compiled. A kernel that fails is left for its own compile to report (with its
    diagnostics), and where no thread can start they all are."""
    if len(kernels) < 2:
        return 0
    arch = arch or current_arch()
    todo: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {}
    for source, options, names in kernels:
        key = _cache_key(source, tuple(options), arch, tuple(names))
        with _LOCK:
            cached = key in _MEMORY_CACHE
        if not cached and key not in todo:
            todo[key] = (source, tuple(options), tuple(names))
    if len(todo) < 2:
        return 0

    def one(kernel: tuple[str, tuple[str, ...], tuple[str, ...]]) -> bool:
        try:
            compile_to_cubin(kernel[0], arch, kernel[1], kernel[2])
            return True
        except Exception:  # noqa: BLE001 - reported by the kernel's own compile
            return False

    from concurrent.futures import ThreadPoolExecutor

    # Imported here first: threads importing cuda.core at once can see it half initialised.
    from cuda.core import Program  # noqa: F401

    try:
        with ThreadPoolExecutor(min(len(todo), threads or min(COMPILE_THREADS, os.cpu_count() or 1))) as pool:
            return sum(pool.map(one, todo.values()))
    except RuntimeError:  # no thread could start (a process limit): each compiles as it is needed
        return 0


def compile_cuda(
    source: str,
    options: tuple[str, ...] | list[str] = (),
    arch: str | None = None,
    name_expressions: tuple[str, ...] | list[str] = (),
) -> CudaModule:
    """Compile CUDA C++ to a cubin for `arch` (default: the current GPU's exact arch)."""
    arch = arch or current_arch()
    options, name_expressions = tuple(options), tuple(name_expressions)
    cubin, mapping, stats = compile_to_cubin(source, arch, options, name_expressions)
    return CudaModule(source, arch, cubin, mapping, stats, _cache_key(source, options, arch, name_expressions),
                      kernel_signatures(source))


def reset_launch_records() -> None:
    LAUNCHED.clear()


def kernel_resources() -> list[dict[str, Any]]:
    """Registers, shared and local memory of every kernel this process launched (for the profile)."""
    return [asdict(r) for r in LAUNCHED.values() if r.launches > 0]
