"""Benchmark for issue #5's level1/level2 target: the offline template search over the built-in
level1 and level2 suites on one GPU; fast_1 vs torch eager over the problems the families cover (and
over all problems), each best kernel's speedup vs torch eager and torch.compile (timed side by side),
and every problem no family covers with the reason.

    python benchmarks/level_suites.py --generations 4 --wall-time 240
    python benchmarks/level_suites.py --compile-only --generations 1      # smoke, no GPU
    python benchmarks/level_suites.py --suite models --precision pytorch --generations 1 --gpus 0,1,2,3 \
        --recheck-deadline 300 --name models_search   # the operators of real models, PyTorch's default flags
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time

from _common import write_result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", action="append", default=[], help="level1, level2 (default both), models, or a "
                    "directory of KernelBench-format files")
    ap.add_argument("--generations", type=int, default=4)
    ap.add_argument("--wall-time", type=float, default=None)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--no-compile-baseline", action="store_true", help="skip re-timing each best kernel vs torch.compile")
    ap.add_argument("--problem", action="append", default=[], help="only these problems (repeatable; default all)")
    ap.add_argument("--precision", default=None, help="the contract searched and timed under (fp32, pytorch, "
                                                        "kernelbench; default: each problem's own)")
    ap.add_argument("--gpus", default="0", help="GPUs the search and the torch.compile recheck use (0,1,2,3)")
    ap.add_argument("--recheck-deadline", type=float, default=None,
                    help="seconds after the search's end past which no more best kernels are re-timed (named in the rows)")
    ap.add_argument("--name", default="level_suites", help="result file name (one per call when suites run apart)")
    ap.add_argument("--store-dir", default=None,
                    help="keep each suite's results store (every evaluation with its timings, verdict and source) "
                         "as DIR/NAME-SUITE.db; default: a new temporary directory, named in the output")
    a = ap.parse_args()
    store_dir = a.store_dir or tempfile.mkdtemp(prefix="cuforge-suites-")
    # a suite given as a directory keeps its store beside the others, named by the directory's own name
    store_of = {suite: os.path.join(store_dir, f"{a.name}-{os.path.basename(os.path.normpath(suite))}.db")
                for suite in a.suite or ["level1", "level2"]}
    for path in store_of.values():
        if os.path.exists(path):
            raise SystemExit(f"level_suites: {path} exists; pick another --name or --store-dir")
    os.makedirs(store_dir, exist_ok=True)
    gpus = [int(g) for g in a.gpus.split(",") if g]
    from cuforge.agent.config import RunConfig
    from cuforge.agent.run import execute
    from cuforge.kernels.families import families_for
    from cuforge.problems.suites import load_suite
    from cuforge.results.leaderboard import build_leaderboard
    from cuforge.results.store import Store
    from cuforge.rewards import fast_p, geomean

    out: dict = {"generations": a.generations, "suites": {}}
    for suite in a.suite or ["level1", "level2"]:
        problems = [p for p in load_suite(suite).problems if not a.problem or p.id in a.problem]
        covered = {p.id for p in problems if families_for(p)[0]}
        uncovered = {p.id: families_for(p)[1] for p in problems if p.id not in covered}
        store_path = store_of[suite]
        store = Store(store_path)
        print(f"{suite}: results store {store_path}", flush=True)
        cfg = RunConfig(suite=suite, problems=sorted(covered), islands=1, generations=a.generations,
                        wall_time_s=a.wall_time, compile_only=a.compile_only, baseline="torch",
                        # compile-only has no GPUs: there --gpus counts workers, and "all" is one a CPU core
                        precision=a.precision, gpus="all" if a.compile_only else a.gpus)
        t0 = time.perf_counter()
        run_id, search = execute(cfg, store, None, False)
        board = build_leaderboard(store.evaluations(run_id), store.run_problems(run_id), run_id, "torch")
        best = {r.problem_id: r.best_speedup for r in board.rows}
        failures = failures_by_problem(store, run_id)
        rows = [{"problem": r.problem_id, "evaluations": r.evaluations, "correct": r.correct,
                 "vs_torch": r.speedups_of_best.get("torch"), "vs_torch_compile": r.speedups_of_best.get("torch.compile"),
                 # the search's own side-by-side ratio, kept beside the recheck's: torch.compile's time has
                 # differed by half between processes on one problem (its kernels picked afresh each time)
                 "search_vs_torch_compile": r.speedups_of_best.get("torch.compile"),
                 "best_ms": r.best_median_ms, "best_candidate_id": r.best_candidate_id,
                 "failures": failures.get(r.problem_id, [])} for r in board.rows]
        if not (a.compile_only or a.no_compile_baseline):
            judged = {p.id: p.under(a.precision) if a.precision else p for p in problems}
            deadline = None if a.recheck_deadline is None else time.monotonic() + a.recheck_deadline
            time_against_torch_compile(store, judged, rows, a.precision, gpus, deadline)
            for r in rows:  # the side-by-side recheck is the number reported
                if r.get("recheck", {}).get("status") == "ok":
                    r["vs_torch"] = r["recheck"]["vs_torch"]
            best = {r["problem"]: r["vs_torch"] for r in rows}
        compiled = [r["vs_torch_compile"] for r in rows if r["vs_torch_compile"]]
        out["suites"][suite] = {
            "precision": a.precision or "each problem's own", "problems": len(problems), "covered": len(covered), "evaluations": search.stats.evaluations,
            "wall_s": round(time.perf_counter() - t0, 1), "stop_reason": search.stats.stop_reason,
            "fast_1_covered": fast_p(best, sorted(covered), 1.0),
            "fast_1_all": fast_p(best, [p.id for p in problems], 1.0),
            "geomean_vs_torch": geomean(v for v in best.values() if v),
            "geomean_vs_torch_compile": geomean(compiled) if compiled else None,
            "rows": rows, "not_covered": uncovered, "store": store_path}
        s = out["suites"][suite]
        print(f"{suite}: {s['covered']}/{s['problems']} covered, fast_1 {s['fast_1_covered']:.2f} over covered, "
              f"{s['fast_1_all']:.2f} over all; {s['evaluations']} evaluations in {s['wall_s']} s", flush=True)
        for r in rows:
            print(f"  {r['problem']}: vs torch {r['vs_torch']}, vs torch.compile {r['vs_torch_compile']}", flush=True)
            for f in r["failures"]:
                print(f"      {f}", flush=True)
    write_result(a.name, out)


def failures_by_problem(store, run_id: str) -> dict[str, list[str]]:
    """Each problem's failed evaluations in a run, verdict and message, so a miss says why."""
    failures: dict[str, list[str]] = {}
    for e in store.evaluations(run_id):
        if e["status"] not in ("ok", "compiled"):
            failures.setdefault(e["problem_id"], []).append(f"{e['status']}: {(e['message'] or '')[:300]}")
    return failures


def time_against_torch_compile(store, problems: dict, rows: list[dict], precision: str | None = "fp32",
                               gpus: list[int] = (0,), deadline: float | None = None,
                               sources: dict | None = None) -> None:
    """Each problem's best kernel evaluated once more with torch eager and torch.compile timed beside
    it in one worker (the search leaves torch.compile out: its compile time dominates short evaluations),
    under the run's precision contract (eager and torch.compile under the other flags are timed too).
    Rows are shared out over `gpus`, a worker each; past `deadline` (time.monotonic) a row is left
    un-timed and says so. `sources`: each best candidate (a Candidate's dict) by its id, where there is
    no store to read them from."""
    from cuforge.sandbox.protocol.candidate import Candidate
    from cuforge.sandbox.protocol.evaluation import EvalConfig
    from cuforge.sandbox.driver.supervisor import Supervisor

    todo = [r for r in rows if r["best_candidate_id"] is not None]
    if sources is None:
        # The store's connection belongs to this thread: every source is read before the workers start.
        sources = {r["best_candidate_id"]: store.candidate_source(r["best_candidate_id"]) for r in todo}
    lock = threading.Lock()

    def work(gpu: int) -> None:
        with Supervisor(gpu=gpu) as sup:
            while True:
                with lock:
                    if not todo:
                        return
                    row = todo.pop(0)
                if deadline is not None and time.monotonic() > deadline:
                    row["recheck"] = {"status": "not re-timed: past the benchmark's recheck deadline"}
                    continue
                problem = problems[row["problem"]]
                cfg = EvalConfig(baselines=("torch", "torch.compile"), max_timing_s=2.0, profile=False,
                                 precision=problem.contract(precision))
                ev = sup.evaluate(problem, Candidate.from_dict(sources[row["best_candidate_id"]]), cfg)
                row["recheck"] = {"status": ev.status, "vs_torch": ev.speedups.get("torch"),
                                  "vs_torch_compile": ev.speedups.get("torch.compile"),
                                  # the same kernel against eager and torch.compile under the other contract's flags
                                  **{f"vs_{k}": v for k, v in ev.speedups.items() if k not in ("torch", "torch.compile")}}
                row["vs_torch_compile"] = ev.speedups.get("torch.compile")
                print(f"  {row['problem']} recheck (GPU {gpu}): {row['recheck']}", flush=True)

    threads = [threading.Thread(target=work, args=(g,)) for g in gpus]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
