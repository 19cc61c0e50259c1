"""Benchmark 3: one kernel evaluated 10 times in one worker; max/min of its medians (target <= 1.02).
Also benchmark 4: the harness's kernel time against Nsight Compute's duration for the same kernels."""

from __future__ import annotations

import argparse
import os
import tempfile

from _common import ROOT, write_result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--skip-ncu", action="store_true")
    a = ap.parse_args()
    os.environ.setdefault("CUFORGE_CACHE_DIR", tempfile.mkdtemp(prefix="cuforge-bench-cache-"))
    from test_gpu_sandbox import hgemm_candidate

    from cuforge.problems.hgemm import hgemm_problem
    from cuforge.problems.suites import load_problem
    from cuforge.sandbox.protocol.candidate import Candidate
    from cuforge.sandbox.protocol.evaluation import EvalConfig
    from cuforge.sandbox.driver.supervisor import Supervisor

    relu = Candidate((ROOT / "tests" / "gpu_candidates" / "relu_runtime.py").read_text())
    cases = [("level1/relu", load_problem("level1/relu"), relu),
             ("hgemm/1024_1024_1024", hgemm_problem(1024, 1024, 1024), hgemm_candidate("fp32")),
             ("hgemm/256_256_256", hgemm_problem(256, 256, 256), hgemm_candidate("fp32"))]
    results = {}
    with Supervisor(gpu=0) as sup:
        for label, problem, cand in cases:
            medians, base = [], []
            for _ in range(a.repeats):
                ev = sup.evaluate(problem, cand, EvalConfig(baselines=("torch",), profile=False))
                assert ev.ok, (label, ev.status, ev.message)
                medians.append(ev.timings["candidate"].median_ms)
                base.append(ev.timings["torch"].median_ms)
            entry = {"candidate_medians_ms": medians, "max_over_min": max(medians) / min(medians),
                     "torch_max_over_min": max(base) / min(base), "method": ev.timings["candidate"].method}
            if not a.skip_ncu:
                from cuforge.sandbox.driver.ncu import NcuError, harness_vs_ncu, ncu_profile

                try:
                    prof = ncu_profile(problem, cand)
                    entry["ncu"] = prof
                    entry["harness_over_ncu"] = harness_vs_ncu(sorted(medians)[len(medians) // 2], prof)
                except NcuError as e:
                    entry["ncu_error"] = str(e)
            results[label] = entry
    write_result("repeatability", {"repeats": a.repeats, "cases": results, "target_max_over_min": 1.02})


if __name__ == "__main__":
    main()
