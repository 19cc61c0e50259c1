"""Benchmark: search throughput with the local executor on one GPU and on several, side by side.

The same template search (same suite, seed, islands and generations) runs once per GPU setting;
each run starts with an empty kernel cache (so no run compiles less than another) and a warm
cuBLASLt helper and ceilings cache (built once by a tiny warm-up run). Throughput is evaluations
per minute of the run's wall time (worker start included), and the steady-state rate between the
10th and the last evaluation.

    python benchmarks/multi_gpu_scaling.py --gpus 0 0,1
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import tempfile
import time

from _common import write_result


def one_run(suite: str, gpus: str, islands: int, generations: int, db: str) -> dict:
    from cuforge.agent.config import RunConfig
    from cuforge.agent.run import execute
    from cuforge.results.store import Store

    cfg = RunConfig(suite=suite, gpus=gpus, islands=islands, generations=generations, seed=0)
    store = Store(db)
    t0 = time.perf_counter()
    run_id, search = execute(cfg, store, None, False)
    wall = time.perf_counter() - t0
    with sqlite3.connect(db) as c:
        rows = c.execute("SELECT e.created_at, e.status, e.device FROM evaluations e WHERE e.run_id = ? ORDER BY e.created_at",
                         (run_id,)).fetchall()
    stamps = [r[0] for r in rows]
    k = min(10, len(stamps) - 1)
    steady = (len(stamps) - 1 - k) / (stamps[-1] - stamps[k]) * 60 if len(stamps) > k + 1 else None
    per_gpu: dict[str, int] = {}
    for r in rows:
        g = json.loads(r[2]).get("gpu") or "?"
        per_gpu[g] = per_gpu.get(g, 0) + 1
    return {"gpus": gpus, "evaluations": len(rows), "ok": sum(r[1] == "ok" for r in rows), "wall_s": round(wall, 2),
            "evals_per_min": round(len(rows) / wall * 60, 1), "steady_evals_per_min": round(steady, 1) if steady else None,
            "per_gpu": per_gpu, "stop_reason": search.stats.stop_reason,
            "best": {p: s.best_speedup for p, s in list(search.states.items())[:5]}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", default="hgemm-small")
    ap.add_argument("--gpus", nargs="+", default=["0", "0,1"])
    ap.add_argument("--islands", type=int, default=1)
    ap.add_argument("--generations", type=int, default=2)
    a = ap.parse_args()
    cache = tempfile.mkdtemp(prefix="cuforge-scaling-cache-")
    os.environ["CUFORGE_CACHE_DIR"] = cache
    work = tempfile.mkdtemp(prefix="cuforge-scaling-")
    # Warm-up: builds the cuBLASLt helper and measures the ceilings once, for every later run.
    from cuforge.agent.config import RunConfig
    from cuforge.agent.run import execute
    from cuforge.results.store import Store

    execute(RunConfig(suite=a.suite, problems=["hgemm/64_64_64"], gpus="0", islands=1, generations=1),
            Store(os.path.join(work, "warm.db")), None, False)
    runs = []
    for gpus in a.gpus:
        shutil.rmtree(os.path.join(cache, "cubins"), ignore_errors=True)
        runs.append(one_run(a.suite, gpus, a.islands, a.generations, os.path.join(work, f"run-{gpus}.db")))
        print(runs[-1], flush=True)
    base = runs[0]
    for r in runs:
        r["scaling_vs_first"] = round(r["evals_per_min"] / base["evals_per_min"], 3)
        if r["steady_evals_per_min"] and base["steady_evals_per_min"]:
            r["steady_scaling_vs_first"] = round(r["steady_evals_per_min"] / base["steady_evals_per_min"], 3)
    write_result("multi_gpu_scaling", {"suite": a.suite, "islands": a.islands, "generations": a.generations,
                                       "runs": runs})


if __name__ == "__main__":
    main()
