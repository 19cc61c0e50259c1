"""Where a split-judge evaluation's time goes: hgemm 1024^3 evaluations (each a distinct kernel, so
each compiles) judged by `sandbox/judge.py` in this process, not through a worker, with the judge's
recorded steps per evaluation and a cProfile of the judge's side (time waiting on the candidate's
process shows as socket waits). Writes benchmarks/results/split_profile.json.

    python benchmarks/split_profile.py --n 12
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import tempfile
import time

from _common import write_result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--top", type=int, default=45)
    a = ap.parse_args()
    os.environ.setdefault("CUFORGE_CACHE_DIR", tempfile.mkdtemp(prefix="cuforge-bench-cache-"))
    from test_gpu_sandbox import hgemm_candidate

    from cuforge.problems.hgemm import hgemm_problem
    from cuforge.sandbox.judge import in_host as judge
    from cuforge.sandbox.protocol.candidate import Candidate
    from cuforge.sandbox.protocol.evaluation import EvalConfig
    from cuforge.sandbox.driver.payload import problem_payload
    from cuforge.sandbox.host.monitor import settle_torch
    from cuforge.sandbox.judge.worker import _device_info

    problem = problem_payload(hgemm_problem(1024, 1024, 1024))
    base = hgemm_candidate("fp32")
    config = EvalConfig(baselines=("torch",))
    settle_torch()  # as a worker does before its first evaluation
    info = _device_info("cuda", "none")
    t = time.perf_counter()
    pool = judge.host_pool("cuda")
    first = judge.evaluate_request(problem, Candidate("// warm-up\n" + base.source, "kernel", base.launch).to_dict(),
                                   config, info)[0]
    warm_s = time.perf_counter() - t
    prof = cProfile.Profile()
    evals = []
    t0 = time.perf_counter()
    prof.enable()
    for i in range(a.n):
        cand = Candidate(f"// variant {i}\n" + base.source, "kernel", base.launch, "bench").to_dict()
        ev, _ = judge.evaluate_request(problem, cand, config, info)
        evals.append(ev)
    prof.disable()
    total = time.perf_counter() - t0
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(a.top)
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
    print(out.getvalue())
    steps = sorted({k for ev in evals for k in ev.correctness.get("judge_phases_s", {})})
    result = {
        "problem": problem["id"], "evaluations": a.n, "statuses": sorted({ev.status for ev in evals}),
        "first_status": f"{first.status}: {first.message[:200]}", "first_eval_s": warm_s,
        "total_s": total, "evals_per_minute": a.n / total * 60,
        "median_eval_s": statistics.median(ev.wall_s for ev in evals),
        "median_step_s": {k: statistics.median(ev.correctness["judge_phases_s"].get(k, 0.0) for ev in evals)
                          for k in steps},
        "calls_per_batch": evals[-1].correctness.get("calls_per_batch"),
        "candidate_batch": evals[-1].correctness.get("candidate_batch"),
        "samples": {name: t.n for name, t in evals[-1].timings.items()},
        "speedup_vs_torch": [round(ev.speedup_vs("torch") or 0, 3) for ev in evals],
        "host_spares": pool.spares, "cprofile": out.getvalue()[:60000],
    }
    from cuforge.sandbox.protocol import wire

    result["judge_still_mapped"] = sum(len(m.opened) for m in wire._STILL_MAPPED)
    for ev in evals[:3]:
        print(ev.status, ev.message[:200], ev.correctness.get("judge_phases_s"))
    pool.close()
    write_result("split_profile", result)


if __name__ == "__main__":
    main()
