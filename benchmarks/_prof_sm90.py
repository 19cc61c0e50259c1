"""Where does the host time of a gemm_sm90 forward go? (cProfile of 200 calls)"""
import cProfile, pstats, sys, time, types
sys.path.insert(0, "src")
import torch
from cuforge.agent.templates.families import GemmSm90
from cuforge.problems.hgemm import hgemm_problem
p = hgemm_problem(1024, 1024, 1024)
cand = GemmSm90().render({"BN": 64, "STAGES": 6, "GROUP_M": 8}, p)
prob = types.ModuleType("prob"); exec(p.source, prob.__dict__)
mod = types.ModuleType("cand"); mod.__dict__["__cuforge_problem__"] = prob
exec(cand.module_source(), mod.__dict__)
m = mod.ModelNew()
a = torch.randn(1024, 1024, device="cuda", dtype=torch.float16); b = torch.randn(1024, 1024, device="cuda", dtype=torch.float16)
out = m(a, b); torch.cuda.synchronize()
print("max err", (out.float() - (a.float() @ b.float())).abs().max().item())
for _ in range(3):
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(100): m(a, b)
    t1 = time.perf_counter(); torch.cuda.synchronize()
    print("host us/call", (t1 - t0) / 100 * 1e6)
pr = cProfile.Profile(); pr.enable()
for _ in range(200): m(a, b)
pr.disable(); torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(12)
