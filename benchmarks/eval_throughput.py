"""Benchmark 2: end-to-end evaluations per GPU-minute on hgemm 1024^3 with a warm worker (the worker's
judge as CUFORGE_JUDGE says: in-process by default, or split).

Each evaluation compiles a distinct kernel variant (a cache miss), runs 5 correctness trials and
times the candidate interleaved with cuBLAS (>= 30 samples or RSE < 0.5%). With --precompile the
next candidates' kernels are compiled on CPU processes while the GPU evaluates the current one.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import os
from concurrent.futures import ProcessPoolExecutor

from _common import write_result


def _compile(args: tuple[str, str, tuple[str, ...]]) -> float:
    from cuforge.runtime import compile_cuda

    t0 = time.perf_counter()
    compile_cuda(args[0], arch=args[1], options=args[2])
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--precompile", action="store_true")
    a = ap.parse_args()
    os.environ.setdefault("CUFORGE_CACHE_DIR", tempfile.mkdtemp(prefix="cuforge-bench-cache-"))
    from test_gpu_sandbox import hgemm_candidate

    from cuforge.problems.hgemm import hgemm_problem
    from cuforge.sandbox.protocol.candidate import Candidate
    from cuforge.sandbox.protocol.evaluation import EvalConfig
    from cuforge.sandbox.driver.supervisor import Supervisor

    problem = hgemm_problem(1024, 1024, 1024)
    base = hgemm_candidate("fp32")
    cands = [Candidate(f"// variant {i}\n" + base.source, "kernel", base.launch, "bench") for i in range(a.n)]
    config = EvalConfig(baselines=("torch",))
    with Supervisor(gpu=0) as sup:
        info = sup.start()
        sup.evaluate(problem, Candidate("// warm-up\n" + base.source, "kernel", base.launch), config)
        pool = ProcessPoolExecutor(8) if a.precompile else None
        if pool:
            arch = "sm_" + info["compute_capability"].replace(".", "") + ("a" if info["compute_capability"] == "9.0" else "")
            futures = [pool.submit(_compile, (c.source, arch, c.launch.options)) for c in cands]
        walls, statuses, phases = [], [], []
        last = None
        t0 = time.perf_counter()
        for i, c in enumerate(cands):
            if pool:
                futures[i].result()
            ev = sup.evaluate(problem, c, config)
            walls.append(ev.wall_s)
            statuses.append(ev.status)
            phases.append(ev.correctness.get("judge_phases_s", {}))
            last = ev
        total = time.perf_counter() - t0
        if pool:
            pool.shutdown()
    judge = info.get("judge", "inprocess")
    steps = sorted({k for p in phases for k in p})
    write_result("eval_throughput" + ("_precompile" if a.precompile else "") + ("" if judge == "inprocess" else f"_{judge}"), {
        "problem": problem.id, "evaluations": a.n, "all_ok": all(s == "ok" for s in statuses),
        "statuses": sorted(set(statuses)), "total_s": total, "evals_per_gpu_minute": a.n / total * 60,
        "median_eval_s": statistics.median(walls), "judge": judge,
        # Where an evaluation's time goes (the split judge records its steps): median seconds per step.
        "median_phase_s": {k: statistics.median(p.get(k, 0.0) for p in phases) for k in steps},
        # and the mean: a step that is long once in a while (a wait for a spare) shows here, not there
        "mean_phase_s": {k: round(statistics.fmean(p.get(k, 0.0) for p in phases), 4) for k in steps},
        "mean_eval_s": statistics.fmean(walls),
        "precompile": a.precompile, "target_per_minute": 120,
        # What the last evaluation timed and how (a contender timed by events where graphs failed shows here).
        "last_timings": {k: {"method": t.method, "n": t.n, "median_ms": t.median_ms} for k, t in (last.timings if last else {}).items()},
        "last_notes": {k: v for k, v in (last.correctness if last else {}).items()
                       if k in ("graph_fallback", "eager_flags", "escape_check", "timing_input_sets", "baselines_skipped")},
        "worker": info,
    })


if __name__ == "__main__":
    main()
