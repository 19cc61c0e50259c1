"""Quick H100 check: gemm_sm90 seeds vs gemm_sm80 seed vs cuBLAS on a few shapes (sandbox timing)."""
import json, os, sys
sys.path.insert(0, "src")
from cuforge.agent.templates.families import GemmSm80, GemmSm90
from cuforge.problems.hgemm import hgemm_problem
from cuforge.sandbox.evaluation import EvalConfig
from cuforge.sandbox.supervisor import Supervisor
cfg = EvalConfig(baselines=("torch", "cublas", "cublaslt"), max_timing_s=2.0, profile=False)
out = []
with Supervisor(gpu=0) as sup:
    for shape in [(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192), (16384, 16384, 1024), (256, 4096, 4096)]:
        p = hgemm_problem(*shape)
        for fam in (GemmSm90(), GemmSm80()):
            for c in fam.seeds(p)[: (3 if fam.name == "gemm_sm90" else 1)]:
                ev = sup.evaluate(p, fam.render(c, p), cfg)
                row = {"shape": shape, "family": fam.name, "config": c, "status": ev.status, "msg": ev.message[:200],
                       "vs_cublas": ev.speedups.get("cublas"), "vs_cublaslt": ev.speedups.get("cublaslt"),
                       "ms": ev.timings["candidate"].median_ms if "candidate" in ev.timings else None}
                print(row, flush=True)
                out.append(row)
json.dump(out, open(os.environ.get("OUT", "/tmp") + "/quick90.json", "w"), indent=1)
