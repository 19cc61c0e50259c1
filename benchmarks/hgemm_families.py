"""Benchmark: the GEMM template families' seed configs against cuBLAS and cuBLASLt on a few hgemm
shapes, evaluated by the sandbox (correctness trials, anti-cheat, interleaved timing) in one worker.

    python benchmarks/hgemm_families.py
"""

from __future__ import annotations

from _common import parser, write_result

SHAPES = [(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192), (16384, 16384, 1024),
          (256, 4096, 4096)]


def main() -> None:
    parser(__doc__).parse_args()
    from cuforge.kernels.gemm import GemmSm80, GemmSm90
    from cuforge.problems.hgemm import hgemm_problem
    from cuforge.sandbox.protocol.evaluation import EvalConfig
    from cuforge.sandbox.driver.supervisor import Supervisor

    cfg = EvalConfig(baselines=("torch", "cublas", "cublaslt"), max_timing_s=2.0, profile=False)
    rows = []
    with Supervisor(gpu=0) as sup:
        for shape in SHAPES:
            p = hgemm_problem(*shape)
            for fam, n in ((GemmSm90(), 3), (GemmSm80(), 1)):
                for c in fam.seeds(p)[:n]:
                    ev = sup.evaluate(p, fam.render(c, p), cfg)
                    rows.append({"shape": shape, "family": fam.name, "config": c, "status": ev.status,
                                 "message": ev.message[:200], "vs_cublas": ev.speedups.get("cublas"),
                                 "vs_cublaslt": ev.speedups.get("cublaslt"),
                                 "ms": ev.timings["candidate"].median_ms if "candidate" in ev.timings else None})
                    print(rows[-1], flush=True)
    write_result("hgemm_families", {"rows": rows})


if __name__ == "__main__":
    main()
