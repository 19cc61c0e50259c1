"""Baselines, as contenders timed interleaved with the candidate: torch eager, torch.compile,
cuBLAS (torch.matmul) and cuBLASLt with algorithm autotuning over the heuristic's top candidates."""

from __future__ import annotations

import copy

import ctypes
import glob
import hashlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

LT_WORKSPACE_BYTES = 32 * 2**20
LT_TOP_ALGOS = 16
_NATIVE = Path(__file__).parent / "native"


class BaselineUnavailable(RuntimeError):
    """This baseline does not apply to the problem, or its tools are missing; the message says which."""


def eager(model: torch.nn.Module, sets: list[list[Any]]) -> Callable[[int], Any]:
    def call(k: int) -> Any:
        with torch.no_grad():
            return model(*sets[k])

    return call


def eager_under_flags(model: torch.nn.Module, sets: list[list[Any]], enter: Callable[[], None],
                      leave: Callable[[], None]) -> Callable[[int], Any]:
    """Eager under other global precision flags than the evaluation's: set before each call and put
    back after it, so nothing else (the candidate, the other contenders, the guard) sees them."""
    def call(k: int) -> Any:
        enter()
        try:
            with torch.no_grad():
                return model(*sets[k])
        finally:
            leave()

    return call


# (model, mode, compiled) of this evaluation only, per flags: the evaluation's own, and the other contract's.
_COMPILED: dict[str, list[tuple[torch.nn.Module, str, Any]]] = {"own": [], "other": []}


def _nothing() -> None:
    pass


def compiled(model: torch.nn.Module, sets: list[list[Any]], mode: str = "default") -> Callable[[int], Any]:
    """torch.compile (inductor), compiled outside any timed region. Only the current evaluation's
    model is kept (an earlier one's would hold its GPU memory); a new model of the same problem
    reuses dynamo's compiled code, so a run pays the compile once per problem and worker."""
    return _compiled("own", model, sets, mode, _nothing, _nothing)


def compiled_under_flags(model: torch.nn.Module, sets: list[list[Any]], mode: str, enter: Callable[[], None],
                         leave: Callable[[], None]) -> Callable[[int], Any]:
    """torch.compile of a copy of `model`, compiled and called under other global precision flags than the
    evaluation's (set before each call, put back after it): what inductor builds depends on the flags
    at compile time (TF32 in its matmul templates), so the copy is compiled under them, apart from
    the evaluation's own compiled model."""
    return _compiled("other", model, sets, mode, enter, leave)


def _compiled(which: str, model: torch.nn.Module, sets: list[list[Any]], mode: str, enter: Callable[[], None],
              leave: Callable[[], None]) -> Callable[[int], Any]:
    cache = _COMPILED[which]
    hit = next((fn for m, md, fn in cache if m is model and md == mode), None)
    if hit is None:
        cache.clear()
        enter()
        try:
            target = model if which == "own" else copy.deepcopy(model)
            hit = torch.compile(target, mode=None if mode == "default" else mode, dynamic=False)
            with torch.no_grad():
                hit(*sets[0])
        except Exception as e:  # noqa: BLE001 - a baseline that cannot be built is skipped, with the reason
            first = (str(e).strip().splitlines() or [""])[0][:300]
            under = "" if which == "own" else " under the other flags"
            raise BaselineUnavailable(f"torch.compile{under} failed: {type(e).__name__}: {first}") from None
        finally:
            leave()
        cache.append((model, mode, hit))
    fn = hit

    def call(k: int) -> Any:
        enter()
        try:
            with torch.no_grad():
                return fn(*sets[k])
        finally:
            leave()

    return call


def plain_matmul_shapes(sets: list[list[Any]]) -> tuple[int, int, int, torch.dtype]:
    """(M, N, K, dtype) when the problem is C = A @ B on two 2-D row-major tensors of one dtype."""
    ins = sets[0]
    if len(ins) != 2 or not all(isinstance(x, torch.Tensor) and x.dim() == 2 for x in ins):
        raise BaselineUnavailable("cuBLASLt baseline needs exactly two 2-D inputs (C = A @ B)")
    a, b = ins
    if a.shape[1] != b.shape[0] or a.dtype != b.dtype or not (a.is_contiguous() and b.is_contiguous()):
        raise BaselineUnavailable("cuBLASLt baseline needs contiguous A[M,K], B[K,N] of one dtype")
    if a.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise BaselineUnavailable(f"cuBLASLt baseline does not cover {a.dtype}")
    return a.shape[0], b.shape[1], a.shape[1], a.dtype


# ---------------------------------------------------------------------------------- cuBLASLt helper

def _search_dirs() -> list[Path]:
    roots = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]
    import site

    for sp in site.getsitepackages() + [site.getusersitepackages()] + [p for p in sys.path if "site-packages" in p]:
        roots += glob.glob(os.path.join(sp, "nvidia", "cu1*")) + glob.glob(os.path.join(sp, "nvidia", "cublas"))
    return [Path(r) for r in dict.fromkeys(roots) if r and os.path.isdir(r)]


def _find(patterns: list[str]) -> Path | None:
    for root in _search_dirs():
        for pat in patterns:
            hits = sorted(root.glob(pat))
            if hits:
                return hits[-1]
    return None


def build_cublaslt_helper() -> Path:
    """nvcc-build the helper once per source/toolchain into the cache; returns the .so path."""
    from cuforge.problems.loader import cache_dir

    header = _find(["include/cublasLt.h", "targets/*/include/cublasLt.h"])
    lib = _find(["lib64/libcublasLt.so*", "lib/libcublasLt.so*", "targets/*/lib/libcublasLt.so*"])
    if header is None or lib is None:
        raise BaselineUnavailable("cuBLASLt baseline: cublasLt.h or libcublasLt.so not found (install the CUDA toolkit or nvidia-cublas)")
    src = _NATIVE / "cublaslt_helper.cu"
    tag = hashlib.sha256(src.read_bytes() + str(lib).encode()).hexdigest()[:16]
    out = cache_dir() / "native" / f"libcuforge_cublaslt_{tag}.so"
    from cuforge.sandbox.protocol import trusted_cache

    shared = trusted_cache.verified_path("native", out.name)
    if shared is not None:
        return shared
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    cudart_inc = [f"-I{d}" for d in {str(header.parent)} | _cudart_includes()]
    cmd = ["nvcc", "-O2", "-shared", "-Xcompiler", "-fPIC", *cudart_inc, "-o", str(out) + ".tmp", str(src),
           f"-L{lib.parent}", f"-l:{lib.name}", f"-Xlinker=-rpath,{lib.parent}"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BaselineUnavailable(f"cuBLASLt helper build failed: {e}") from None
    if r.returncode != 0:
        raise BaselineUnavailable(f"cuBLASLt helper build failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    os.replace(str(out) + ".tmp", out)
    return out


def _cudart_includes() -> set[str]:
    hit = _find(["include/cuda_runtime.h"])
    return {str(hit.parent)} if hit else set()


class CublasLt:
    """A tuned cuBLASLt plan for one (M, N, K, dtype)."""

    _lib: ctypes.CDLL | None = None

    def __init__(self, m: int, n: int, k: int, dtype: torch.dtype, device: torch.device) -> None:
        lib = self._load()
        self.m, self.n, self.k, self.dtype = m, n, k, dtype
        self.workspace = torch.empty(LT_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        code = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}[dtype]
        plan = ctypes.c_void_p()
        status = lib.cuforge_lt_create(m, n, k, code, ctypes.c_void_p(self.workspace.data_ptr()),
                                       ctypes.c_size_t(LT_WORKSPACE_BYTES), LT_TOP_ALGOS, ctypes.byref(plan))
        self.plan: ctypes.c_void_p | None = plan
        self.count = lib.cuforge_lt_count(plan) if status == 0 else 0
        if status != 0 or self.count == 0:
            raise BaselineUnavailable(f"cuBLASLt found no algorithm for {m}x{n}x{k} {dtype} (status {status})")
        self.algo = 0

    @classmethod
    def _load(cls) -> ctypes.CDLL:
        if cls._lib is None:
            lib = ctypes.CDLL(str(build_cublaslt_helper()), mode=ctypes.RTLD_GLOBAL)
            lib.cuforge_lt_create.restype = ctypes.c_int
            lib.cuforge_lt_create.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                              ctypes.c_size_t, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
            lib.cuforge_lt_count.argtypes = [ctypes.c_void_p]
            lib.cuforge_lt_run.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                           ctypes.c_void_p, ctypes.c_void_p]
            lib.cuforge_lt_destroy.argtypes = [ctypes.c_void_p]
            cls._lib = lib
        return cls._lib

    def run(self, a: torch.Tensor, b: torch.Tensor, algo: int | None = None) -> torch.Tensor:
        c = torch.empty((self.m, self.n), dtype=self.dtype, device=a.device)
        stream = torch.cuda.current_stream().cuda_stream
        status = self._load().cuforge_lt_run(self.plan, self.algo if algo is None else algo, a.data_ptr(),
                                             b.data_ptr(), c.data_ptr(), stream)
        if status != 0:
            raise RuntimeError(f"cublasLtMatmul failed with status {status}")
        return c

    def autotune(self, sets: list[list[Any]], time_one: Callable[[Callable[[int], Any]], float]) -> dict[str, Any]:
        """Time each heuristic candidate with the harness's own timer; keep the fastest correct one."""
        a, b = sets[0]
        want = torch.matmul(a.float(), b.float())
        times: dict[int, float] = {}
        for algo in range(self.count):
            try:
                out = self.run(a, b, algo)
                if not torch.allclose(out.float(), want, rtol=2e-2, atol=2e-2):
                    continue
                times[algo] = time_one(self._timed(sets, algo))
            except RuntimeError:
                continue
        if not times:
            raise BaselineUnavailable("cuBLASLt: no heuristic algorithm ran correctly")
        self.algo = min(times, key=lambda a: times[a])
        return {"algorithms_tried": len(times), "chosen": self.algo, "heuristic_first_ms": times.get(0),
                "best_ms": times[self.algo]}

    def _timed(self, sets: list[list[Any]], algo: int) -> Callable[[int], Any]:
        def call(k: int) -> Any:
            return self.run(sets[k][0], sets[k][1], algo)

        return call

    def __del__(self) -> None:
        if getattr(self, "plan", None) and self._lib is not None:
            self._lib.cuforge_lt_destroy(self.plan)
            self.plan = None


_LT_PLANS: dict[tuple[int, int, int, torch.dtype], CublasLt] = {}


def cublaslt(sets: list[list[Any]], device: torch.device, time_one: Callable[[Callable[[int], Any]], float]) -> tuple[Callable[[int], Any], dict[str, Any]]:
    m, n, k, dtype = plain_matmul_shapes(sets)
    key = (m, n, k, dtype)
    plan = _LT_PLANS.get(key)
    info: dict[str, Any] = {"cached": True}
    if plan is None:
        plan = CublasLt(m, n, k, dtype, device)
        info = plan.autotune(sets, time_one)
        _LT_PLANS[key] = plan

    def call(idx: int) -> torch.Tensor:
        return plan.run(*sets[idx])

    return call, info


def cublas(sets: list[list[Any]]) -> Callable[[int], Any]:
    """cuBLAS through torch.matmul with fp32 accumulation (reduced-precision reduction disabled)."""
    plain_matmul_shapes(sets)

    def call(k: int) -> torch.Tensor:
        return torch.matmul(*sets[k])

    return call
