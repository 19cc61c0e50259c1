"""Benchmark for issue #5's GEMM targets: the template search over an hgemm suite (default
hgemm-125) on one GPU, then the per-shape table vs cuBLAS and cuBLASLt-autotune (both timed side by
side in every evaluation) with CUDA-L2's reported numbers beside ours, and the geomeans the issue
sets floors for (all shapes; M*N*K <= 2^30; M*N*K >= 2^36).

    python benchmarks/hgemm_suite.py --suite hgemm-125 --generations 2 --wall-time 540
    python benchmarks/hgemm_suite.py --suite hgemm-small --problem hgemm/64_64_64 --compile-only   # smoke, no GPU
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from _common import write_result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", default="hgemm-125")
    ap.add_argument("--problem", action="append", default=[])
    ap.add_argument("--islands", type=int, default=1)
    ap.add_argument("--generations", type=int, default=2)
    ap.add_argument("--wall-time", type=float, default=None, help="stop the search after this many seconds")
    ap.add_argument("--gpus", default="all")
    ap.add_argument("--compile-only", action="store_true")
    a = ap.parse_args()
    from cuforge.agent.config import RunConfig
    from cuforge.agent.run import execute
    from cuforge.results.leaderboard import build_leaderboard
    from cuforge.results.store import Store

    db = os.path.join(tempfile.mkdtemp(prefix="cuforge-hgemm-suite-"), "cuforge.db")
    store = Store(db)
    cfg = RunConfig(suite=a.suite, problems=a.problem, islands=a.islands, generations=a.generations,
                    wall_time_s=a.wall_time, gpus=a.gpus, compile_only=a.compile_only, baseline="cublas")
    t0 = time.perf_counter()
    run_id, search = execute(cfg, store, None, False)
    wall = time.perf_counter() - t0
    board = build_leaderboard(store.evaluations(run_id), store.run_problems(run_id), run_id, "cublas")
    families: dict[str, int] = {}
    for row in board.rows:
        if row.best_candidate_id is not None:
            src = store.candidate_source(row.best_candidate_id)["source"]
            fam = src.split('"family": "', 1)[-1].split('"', 1)[0] if '"family": "' in src else "?"
            families[fam] = families.get(fam, 0) + 1
    tg = board.hgemm_targets
    print(f"{search.stats.evaluations} evaluations in {wall:.0f} s ({search.stats.stop_reason}); targets: {tg}")
    for r in board.hgemm:
        print(f"{r['M']}x{r['N']}x{r['K']}: vs cuBLAS {r['measured_vs_cublas']}, vs cuBLASLt {r['measured_vs_cublaslt']}, "
              f"CUDA-L2 reported {r['cuda_l2_reported_vs_cublas']}")
    write_result("hgemm_suite", {"suite": a.suite, "run_id": run_id, "evaluations": search.stats.evaluations,
                                 "wall_s": round(wall, 1), "stop_reason": search.stats.stop_reason,
                                 "islands": a.islands, "generations": a.generations, "targets": tg,
                                 "best_families": families, "per_shape": board.hgemm})


if __name__ == "__main__":
    main()
