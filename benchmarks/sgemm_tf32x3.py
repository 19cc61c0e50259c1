"""Benchmark: the fp32 GEMM families (3xTF32 on wgmma, 3xTF32 on mma.sync, FFMA) against cuBLAS SGEMM
(torch.matmul with TF32 off, as the harness runs the reference) on square and KernelBench-like fp32
shapes, evaluated by the sandbox (fp32 tolerance on fresh inputs, interleaved timing) in one worker.

    python benchmarks/sgemm_tf32x3.py [--shapes 4096x4096x4096,...]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import write_result

SHAPES = [(4096, 4096, 4096), (2048, 2048, 2048), (8192, 8192, 8192), (1024, 1024, 1024)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in SHAPES), help="MxKxN,...")
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args()
    from template_helpers import problem_from_expr

    from cuforge.kernels.fp32 import GemmF32
    from cuforge.kernels.gemm_tf32 import GemmTf32x3Sm90
    from cuforge.sandbox.protocol.evaluation import EvalConfig
    from cuforge.sandbox.driver.supervisor import Supervisor

    cfg = EvalConfig(baselines=("torch",), max_timing_s=1.0, profile=False)
    rows = []
    work = Path(tempfile.mkdtemp(prefix="cuforge-sgemm-"))
    with Supervisor(gpu=0) as sup:
        for spec in a.shapes.split(","):
            m, k, n = (int(x) for x in spec.split("x"))
            p = problem_from_expr(work, "a @ b", f"torch.randn({m}, {k}), torch.randn({k}, {n})", prefix=f"s{m}_{k}_{n}")
            for fam, count in ((GemmTf32x3Sm90(), a.seeds), (GemmF32(), 1)):
                for c in fam.seeds(p)[:count]:
                    ev = sup.evaluate(p, fam.render(c, p), cfg)
                    ms = ev.timings["candidate"].median_ms if "candidate" in ev.timings else None
                    rows.append({"shape": [m, k, n], "family": fam.name, "config": c, "status": ev.status,
                                 "message": ev.message[:300], "vs_cublas_sgemm": ev.speedups.get("torch"), "ms": ms,
                                 "tflops": 2 * m * n * k / ms / 1e9 if ms else None,
                                 "sgemm_ms": ev.timings["torch"].median_ms if "torch" in ev.timings else None})
                    print(rows[-1], flush=True)
    write_result("sgemm_tf32x3", {"rows": rows})


if __name__ == "__main__":
    main()
