"""What the jail costs (issue #21): bubblewrap's own start, a GPU worker's start, and evaluations in a
warm worker, jailed and unjailed side by side in one run (alternating, so drift hits both alike).

    python benchmarks/jail_overhead.py --starts 3 --evals 20

Results: benchmarks/results/jail_overhead.json (and $OUT/).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time

from _common import write_result


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def summary(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "p20": pct(xs, 0.2), "p80": pct(xs, 0.8), "n": len(xs)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("--evals", type=int, default=20)
    a = ap.parse_args()
    os.environ.setdefault("CUFORGE_CACHE_DIR", tempfile.mkdtemp(prefix="cuforge-bench-cache-"))
    from test_gpu_sandbox import hgemm_candidate

    from cuforge.problems.hgemm import hgemm_problem
    from cuforge.sandbox.protocol.candidate import Candidate
    from cuforge.sandbox.protocol.evaluation import EvalConfig
    from cuforge.sandbox.driver.jail import JailPlan, bwrap_argv, jail_plan
    from cuforge.sandbox.driver.supervisor import Supervisor

    plan = jail_plan()
    argv = bwrap_argv(plan, ["/bin/true"], gpu=True, shared_cache=None)
    subprocess.run(argv, check=True)
    bwrap_ms = []
    for _ in range(20):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True)
        bwrap_ms.append((time.perf_counter() - t0) * 1e3)
    plain_ms = []
    for _ in range(20):
        t0 = time.perf_counter()
        subprocess.run(["/bin/true"], check=True)
        plain_ms.append((time.perf_counter() - t0) * 1e3)

    # Where a worker's start goes: Python, torch and a CUDA context, jailed and not.
    import sys

    from cuforge.sandbox.driver.jail import jail_env

    probe = [sys.executable, "-c", "import time; t = time.perf_counter(); import torch; "
             "torch.zeros(1, device='cuda'); torch.cuda.synchronize(); print(time.perf_counter() - t)"]
    cuda_init: dict[str, list[float]] = {"jailed": [], "unjailed": []}
    env = dict(os.environ, **jail_env(False))
    for _ in range(3):
        cuda_init["jailed"].append(float(subprocess.run(bwrap_argv(plan, probe, gpu=True, shared_cache=None), env=env,
                                                        capture_output=True, text=True, check=True).stdout))
        cuda_init["unjailed"].append(float(subprocess.run(probe, capture_output=True, text=True, check=True).stdout))

    problem = hgemm_problem(1024, 1024, 1024)
    base = hgemm_candidate("fp32")
    config = EvalConfig(baselines=("torch",))
    sups = {"jailed": Supervisor(gpu=0, jail=plan),
            "unjailed": Supervisor(gpu=0, jail=JailPlan("none", "benchmark"), unsafe_no_jail=True)}
    starts: dict[str, list[float]] = {k: [] for k in sups}
    evals: dict[str, list[float]] = {k: [] for k in sups}
    statuses: set[str] = set()
    try:
        for _ in range(a.starts):
            for name, sup in sups.items():
                t0 = time.perf_counter()
                sup.start()
                starts[name].append(time.perf_counter() - t0)
        for name, sup in sups.items():  # warm-up
            sup.evaluate(problem, Candidate("// warm-up\n" + base.source, "kernel", base.launch), config)
        for i in range(a.evals):
            for name, sup in sups.items():
                ev = sup.evaluate(problem, Candidate(f"// {name} {i}\n" + base.source, "kernel", base.launch), config)
                statuses.add(ev.status)
                evals[name].append(ev.wall_s)
        infos = {k: s.info for k, s in sups.items()}
    finally:
        for sup in sups.values():
            sup.close()
    write_result("jail_overhead", {
        "jail": plan.detail, "bubblewrap_start_ms": summary(bwrap_ms), "plain_process_start_ms": summary(plain_ms),
        "worker_start_s": {k: summary(v) for k, v in starts.items()},
        "torch_cuda_init_s": {k: summary(v) for k, v in cuda_init.items()},
        "evaluation_wall_s": {k: summary(v) for k, v in evals.items()},
        "evals_per_minute": {k: 60 / statistics.median(v) for k, v in evals.items()},
        "problem": problem.id, "statuses": sorted(statuses), "workers": infos,
    })


if __name__ == "__main__":
    main()
