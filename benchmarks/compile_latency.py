"""Benchmark 1: compile latency of a typical GEMM candidate.

Fast runtime (NVRTC -> cubin): cold (distinct sources, nothing cached), cached in memory, cached
on disk; against torch.utils.cpp_extension.load_inline of the same kernel, in the same run.
"""

from __future__ import annotations

import statistics
import tempfile
import time
import os

from _common import ROOT, parser, write_result


def gemm_source(salt: int) -> str:
    body = (ROOT / "tests" / "gpu_candidates" / "hgemm_simt.cu").read_text()
    defs = "#define ACC_T float\n#define ACC_ZERO 0.f\n#define ACC_FMA(a, b, c) fmaf(a, b, c)\n#define ACC_OUT(x) __float2half(x)\n"
    return f"// variant {salt}\n#define CUFORGE_SALT {salt}\n" + defs + body


def main() -> None:
    parser(__doc__).parse_args()
    os.environ["CUFORGE_CACHE_DIR"] = tempfile.mkdtemp(prefix="cuforge-bench-cache-")
    import torch

    from cuforge import runtime

    arch = runtime.current_arch() if torch.cuda.is_available() else "sm_90a"
    t0 = time.perf_counter()
    runtime.compile_cuda(gemm_source(-1), arch=arch)
    first_in_process = time.perf_counter() - t0
    cold = []
    for salt in range(8):
        t0 = time.perf_counter()
        runtime.compile_cuda(gemm_source(salt), arch=arch)
        cold.append(time.perf_counter() - t0)
    memory = []
    for _ in range(50):
        t0 = time.perf_counter()
        runtime.compile_cuda(gemm_source(3), arch=arch)
        memory.append(time.perf_counter() - t0)
    disk = []
    for salt in range(8):
        runtime._MEMORY_CACHE.clear()
        t0 = time.perf_counter()
        runtime.compile_cuda(gemm_source(salt), arch=arch)
        disk.append(time.perf_counter() - t0)
    load = []
    if torch.cuda.is_available():
        t0 = time.perf_counter()
        runtime.compile_cuda(gemm_source(5), arch=arch).kernel("hgemm_simt")
        load.append(time.perf_counter() - t0)
    inline_s = None
    if torch.cuda.is_available() and os.environ.get("SKIP_LOAD_INLINE") != "1":
        from torch.utils.cpp_extension import load_inline

        cuda_src = gemm_source(99) + r"""
#include <torch/extension.h>
torch::Tensor run(torch::Tensor A, torch::Tensor B) {
    int M = A.size(0), K = A.size(1), N = B.size(1);
    auto C = torch::empty({M, N}, A.options());
    dim3 grid((N + 15) / 16, (M + 15) / 16), block(16, 16);
    hgemm_simt<<<grid, block>>>((const half*)A.data_ptr(), (const half*)B.data_ptr(), (half*)C.data_ptr(), M, N, K);
    return C;
}
"""
        t0 = time.perf_counter()
        load_inline(name=f"cuforge_bench_gemm_{os.getpid()}", cpp_sources="torch::Tensor run(torch::Tensor A, torch::Tensor B);",
                    cuda_sources=cuda_src, functions=["run"], build_directory=tempfile.mkdtemp(),
                    extra_cuda_cflags=["-O3", f"-arch={arch.rstrip('a')}"], verbose=False)
        inline_s = time.perf_counter() - t0
    write_result("compile_latency", {
        "arch": arch,
        "fast_runtime_first_in_process_s": first_in_process,
        "fast_runtime_cold_median_s": statistics.median(cold),
        "fast_runtime_cold_max_s": max(cold),
        "fast_runtime_memory_cached_median_ms": statistics.median(memory) * 1e3,
        "fast_runtime_disk_cached_median_ms": statistics.median(disk) * 1e3,
        "module_load_s": load[0] if load else None,
        "load_inline_cold_s": inline_s,
        "targets": {"cold_s": 0.5, "cached_ms": 5.0},
    })


if __name__ == "__main__":
    main()
