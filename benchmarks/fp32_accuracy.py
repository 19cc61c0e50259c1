"""How close fp32 GEMMs come to the float64 reference on a long K, next to cuBLAS's own fp32 GEMM:
mismatches against the sandbox's fp32 tolerances (atol = rtol = 1e-4), max abs error, relative
error norm. Runs each gemm_f32 config given (default: the seeds) through the sandbox too.

    python benchmarks/fp32_accuracy.py --k 4096
"""

from __future__ import annotations

import argparse

from _common import write_result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--problem", default="level1/matmul_square")
    a = ap.parse_args()
    import torch

    from cuforge.kernels.fp32 import GemmF32
    from cuforge.problems.suites import load_problem
    from cuforge.sandbox.protocol.evaluation import EvalConfig
    from cuforge.sandbox.driver.supervisor import Supervisor

    out: dict = {"problem": a.problem, "cublas": {}, "configs": []}
    torch.manual_seed(0)
    x, y = torch.randn(4096, 4096, device="cuda"), torch.randn(4096, 4096, device="cuda")
    ref = x.double() @ y.double()
    for name, got in (("cublas_fp32", x @ y), ("cublas_tf32", None)):
        if got is None:
            torch.backends.cuda.matmul.allow_tf32 = True
            got = x @ y
            torch.backends.cuda.matmul.allow_tf32 = False
        d = (got.double() - ref)
        out["cublas"][name] = {"mismatches": int((~torch.isclose(got.double(), ref, rtol=1e-4, atol=1e-4)).sum()),
                               "max_abs": float(d.abs().max()), "rel_norm": float(d.norm() / ref.norm())}
        print(name, out["cublas"][name], flush=True)
    p, g = load_problem(a.problem), GemmF32()
    cfg = EvalConfig(baselines=("torch",), max_timing_s=0.5, profile=False)
    with Supervisor(gpu=0) as sup:
        for c in g.seeds(p):
            ev = sup.evaluate(p, g.render(c, p), cfg)
            row = {"config": c, "status": ev.status, "message": ev.message, "vs_torch": ev.speedups.get("torch")}
            out["configs"].append(row)
            print(row, flush=True)
    write_result("fp32_accuracy", out)


if __name__ == "__main__":
    main()
