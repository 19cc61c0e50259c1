"""Decode-shaped products against eager PyTorch (cuBLAS): the models suite's decode GEMV (1 x 4096
through LLaMA-7B's 11008 x 4096 up projection) and skinny GEMM (8 x 4096 through a 4096 x 4096
projection), each in fp32, bf16 and fp16, every seed of the `gemm_skinny` family (CUDA cores) and, in
bf16 and fp16, of `gemm_skinny_tc` (tensor cores) evaluated in one jailed worker beside eager, and each against
the device-to-device copy bandwidth measured in the run (the product reads its weight once, so the
copy bandwidth is its ceiling): of a 2 GiB copy, and of a copy moving the product's own bytes timed as
the judge times the product (graph replays over buffers the L2 does not hold), which pays the same
fixed launch and tail cost a 30 us kernel does.

fp32 runs under the fp32 contract (eager's matmul without TF32, PyTorch's default for matmuls too);
bf16 and fp16 under the `pytorch` contract (PyTorch's default flags, reduced-precision reductions
allowed to cuBLAS; the kernel sums in fp32 either way).

    python benchmarks/skinny_gemm.py --name skinny_gemm
    python benchmarks/skinny_gemm.py --sweep --name skinny_gemm_sweep   # every tensor-core config in bf16

Results: benchmarks/results/NAME.json (and $OUT/NAME.json).
"""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile

from _common import write_result
from kernelbench_bandwidth import copy_bandwidth_gbs, problem_bytes, sized_copy_ms

PROBLEMS = ("models/decode_gemv", "models/skinny_gemm")
DTYPES = ("", "@bf16", "@fp16")


def configs(fam, problem, sweep: bool) -> list[dict]:
    """The family's seeds, or with `sweep` (the tensor-core family on a bf16 problem) every valid config."""
    if not (sweep and fam.name == "gemm_skinny_tc" and problem.id.endswith("@bf16")):
        return fam.seeds(problem)
    points = [dict(zip(fam.knobs, values)) for values in itertools.product(*fam.knobs.values())]
    return [c for c in points if fam.valid(c, problem)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-timing", type=float, default=0.5)
    ap.add_argument("--name", default="skinny_gemm")
    ap.add_argument("--sweep", action="store_true",
                    help="every valid config of gemm_skinny_tc on the bf16 problems, not only its seeds")
    a = ap.parse_args()
    os.environ.setdefault("CUFORGE_CACHE_DIR", tempfile.mkdtemp(prefix="cuforge-bench-cache-"))
    from cuforge.kernels.gemm_skinny import GemmSkinny, GemmSkinnyTC
    from cuforge.problems.suites import load_suite
    from cuforge.sandbox.driver.supervisor import Supervisor
    from cuforge.sandbox.protocol.evaluation import EvalConfig

    families = (GemmSkinny(), GemmSkinnyTC())
    copy = copy_bandwidth_gbs()
    print(f"copy bandwidth {copy:.0f} GB/s", flush=True)
    suite = {p.id: p for p in load_suite("models").problems}
    rows = []
    with Supervisor(gpu=0) as sup:
        for name in PROBLEMS:
            for variant in DTYPES:
                problem = suite[name + variant]
                precision = "fp32" if not variant else "pytorch"
                copy_ms = sized_copy_ms(problem_bytes(problem))  # a copy moving the product's bytes, timed as it is
                cfg = EvalConfig(baselines=("torch",), max_timing_s=a.max_timing, profile=False, precision=precision)
                for fam, config in [(f, c) for f in families if f.supports(problem) is None for c in configs(f, problem, a.sweep)]:
                    ev = sup.evaluate(problem, fam.render(config, problem), cfg)
                    t, eager = ev.timings.get("candidate"), ev.timings.get("torch")
                    gbs = problem_bytes(problem) / (t.median_ms * 1e-3) / 1e9 if t else None
                    row = {"problem": problem.id, "precision": precision, "family": fam.name, "config": config, "status": ev.status,
                           "message": ev.message[:200] if ev.status != "ok" else "",
                           "ms": t.median_ms if t else None, "p20_ms": t.p20_ms if t else None,
                           "p80_ms": t.p80_ms if t else None, "eager_ms": eager.median_ms if eager else None,
                           "vs_eager": eager.median_ms / t.median_ms if t and eager else None,
                           "gbs": gbs, "vs_copy": gbs / copy if gbs else None, "same_size_copy_ms": copy_ms,
                           "vs_same_size_copy": copy_ms / t.median_ms if t else None}
                    rows.append(row)
                    print(row, flush=True)
    best = {}
    for r in rows:
        if r["status"] == "ok" and r["vs_eager"] and r["vs_eager"] > best.get(r["problem"], {}).get("vs_eager", 0):
            best[r["problem"]] = r
    write_result(a.name, {"copy_gbs": copy, "rows": rows,
                          "best": {k: {"family": v["family"], "config": v["config"], "vs_eager": v["vs_eager"], "vs_copy": v["vs_copy"],
                                       "vs_same_size_copy": v["vs_same_size_copy"],
                                       "ms": v["ms"], "eager_ms": v["eager_ms"]} for k, v in best.items()}})


if __name__ == "__main__":
    main()
