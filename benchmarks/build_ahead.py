"""Candidates that build a `load_inline` extension (as most LLM-written candidates do), evaluated on one
GPU in two ways, side by side in one run:

- one after another: each candidate's extension built, then the candidate evaluated (what a single
  `cuforge eval` does: the build runs in a compile-only worker before the GPU's turn);
- built ahead, as the search does: the executor's compile-only workers build several candidates at
  once while the GPU evaluates the ones already built.

Each candidate is a distinct extension (its own name and source), so no build is a cache hit. Writes
benchmarks/results/build_ahead.json: wall time of each way, the ratio, and every evaluation's status,
load time in the GPU's turn and whether it loaded a library built ahead.

    python benchmarks/build_ahead.py --n 8
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _common import write_result

# A CUDA add kernel and its binding, built with torch's load_inline under a per-candidate name.
CANDIDATE = '''
import torch
from torch.utils.cpp_extension import load_inline

CUDA = """
#include <torch/extension.h>
__global__ void add_kernel(const float* a, const float* b, float* out, long n) {{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i] + {zero}f;
}}
torch::Tensor add(torch::Tensor a, torch::Tensor b) {{
    auto out = torch::empty_like(a);
    long n = a.numel();
    add_kernel<<<(n + 255) / 256, 256>>>(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}}
"""
ext = load_inline("{name}", cpp_sources=["torch::Tensor add(torch::Tensor a, torch::Tensor b);"],
                  cuda_sources=[CUDA], functions=["add"], extra_cflags=["-O2"])


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        return ext.add(a.contiguous(), b.contiguous())
'''


def candidates(n: int, tag: str) -> list[Any]:
    from cuforge.sandbox.protocol.candidate import Candidate

    return [Candidate(CANDIDATE.format(name=f"add_{tag}_{i}", zero=f"0.{i:04d}e-30"), "module") for i in range(n)]


def record(ev: Any) -> dict[str, Any]:
    return {"status": ev.status, "wall_s": round(ev.wall_s, 2),
            "load_in_turn_s": ev.correctness.get("judge_phases_s", {}).get("load"),
            "prebuilt_extensions": ev.correctness.get("prebuilt_extensions", 0),
            "gpu_turn_wait_s": ev.device.get("gpu_turn_wait_s", 0.0)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8, help="candidates evaluated each way")
    a = ap.parse_args()
    from template_helpers import problem_from_expr

    from cuforge.sandbox.driver.executor import LocalExecutor
    from cuforge.sandbox.protocol.evaluation import EvalConfig

    problem = problem_from_expr(Path(tempfile.mkdtemp()), "a + b", "torch.randn(4096, 4096), torch.randn(4096, 4096)")
    config = EvalConfig(baselines=("torch",), profile=False)
    executor = LocalExecutor(["0"])
    try:
        executor.supervisors[0].start()  # a warm worker: it says the architecture to build for
        t0 = time.perf_counter()
        serial = [record(executor.evaluate(problem, c, config, executor.build_ahead(problem, c, config)))
                  for c in candidates(a.n, "serial")]
        serial_s = time.perf_counter() - t0

        def built_then_evaluated(c: Any) -> dict[str, Any]:
            return record(executor.evaluate(problem, c, config, executor.build_ahead(problem, c, config)))

        t0 = time.perf_counter()
        with ThreadPoolExecutor(executor.builder_count + 1) as pool:
            ahead = list(pool.map(built_then_evaluated, candidates(a.n, "ahead")))
        ahead_s = time.perf_counter() - t0
    finally:
        executor.close()
    write_result("build_ahead", {
        "problem": "a + b, fp32 4096 x 4096", "candidates_each_way": a.n, "builders": executor.builder_count,
        "one_after_another_s": round(serial_s, 1), "built_ahead_s": round(ahead_s, 1),
        "speedup": round(serial_s / ahead_s, 2),
        "median_load_in_turn_s": {"one_after_another": statistics.median(r["load_in_turn_s"] or 0 for r in serial),
                                  "built_ahead": statistics.median(r["load_in_turn_s"] or 0 for r in ahead)},
        "all_ok": all(r["status"] == "ok" for r in serial + ahead),
        "all_prebuilt": all(r["prebuilt_extensions"] for r in serial + ahead),
        "one_after_another": serial, "built_ahead": ahead})


if __name__ == "__main__":
    main()
