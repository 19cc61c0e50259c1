"""Benchmark for issue #5's GEMM targets: the template search over an hgemm suite (default
hgemm-125) on one GPU, then the per-shape table vs cuBLAS and cuBLASLt-autotune (both timed side by
side in every evaluation) with CUDA-L2's reported numbers beside ours, and the geomeans the issue
sets floors for (all shapes; M*N*K <= 2^30; M*N*K >= 2^36).

    python benchmarks/hgemm_suite.py --suite hgemm-125 --generations 2 --wall-time 540
    python benchmarks/hgemm_suite.py --shard 1/2 ...; python benchmarks/hgemm_suite.py --shard 2/2 ...
    python benchmarks/hgemm_suite.py --merge     # one table and geomeans over every shard's result
    python benchmarks/hgemm_suite.py --table     # that table as markdown (docs/benchmarks.md)
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
    ap.add_argument("--shard", default=None, help="I/N: only every N-th shape starting at the I-th (one device call each)")
    ap.add_argument("--merge", action="store_true", help="combine the shard results into hgemm_suite.json")
    ap.add_argument("--table", action="store_true", help="print hgemm_suite.json's per-shape table as markdown")
    a = ap.parse_args()
    if a.merge:
        merge()
        return
    if a.table:
        print_table()
        return
    from cuforge.agent.config import RunConfig
    from cuforge.kernels.families import config_of
    from cuforge.agent.run import execute
    from cuforge.results.leaderboard import build_leaderboard
    from cuforge.results.store import Store

    problems = list(a.problem)
    name = "hgemm_suite"
    if a.shard:
        from cuforge.problems.hgemm import hgemm_shapes

        try:
            i, n = (int(x) for x in a.shard.split("/"))
            assert 1 <= i <= n
        except (ValueError, AssertionError):
            raise SystemExit(f"--shard takes I/N with 1 <= I <= N (e.g. 2/4), not {a.shard!r}") from None
        problems = [f"hgemm/{m}_{nn}_{k}" for m, nn, k in hgemm_shapes(a.suite)[i - 1::n]]
        name = f"hgemm_suite_shard{i}of{n}"
    db = os.path.join(tempfile.mkdtemp(prefix="cuforge-hgemm-suite-"), "cuforge.db")
    store = Store(db)
    cfg = RunConfig(suite=a.suite, problems=problems, islands=a.islands, generations=a.generations,
                    wall_time_s=a.wall_time, gpus=a.gpus, compile_only=a.compile_only, baseline="cublas")
    t0 = time.perf_counter()
    run_id, search = execute(cfg, store, None, False)
    wall = time.perf_counter() - t0
    board = build_leaderboard(store.evaluations(run_id), store.run_problems(run_id), run_id, "cublas")
    families: dict[str, int] = {}
    best_config: dict[str, dict] = {}
    for row in board.rows:
        if row.best_candidate_id is not None:
            cfg_of_best = config_of(store.candidate_source(row.best_candidate_id)["source"]) or {"family": "?"}
            families[cfg_of_best["family"]] = families.get(cfg_of_best["family"], 0) + 1
            best_config[row.problem_id] = cfg_of_best
    tried: dict[str, list] = {}
    for e in store.evaluations(run_id):  # every config the search timed, for tuning the seeds
        c = config_of(store.candidate_source(e["candidate_id"])["source"]) or {}
        tried.setdefault(e["problem_id"], []).append(
            {"config": " ".join(f"{k}={v}" for k, v in sorted(c.items())), "status": e["status"],
             "ms": e["median_ms"], "vs_cublas": (e["speedups"] or {}).get("cublas")})
    for r in board.hgemm:
        r["best_config"] = best_config.get(r["problem_id"])
        r["tried"] = tried.get(r["problem_id"], [])
    tg = board.hgemm_targets
    print(f"{search.stats.evaluations} evaluations in {wall:.0f} s ({search.stats.stop_reason}); targets: {tg}")
    for r in board.hgemm:
        print(f"{r['M']}x{r['N']}x{r['K']}: vs cuBLAS {r['measured_vs_cublas']}, vs cuBLASLt {r['measured_vs_cublaslt']}, "
              f"CUDA-L2 reported {r['cuda_l2_reported_vs_cublas']}")
    write_result(name, {"suite": a.suite, "run_id": run_id, "evaluations": search.stats.evaluations,
                        "wall_s": round(wall, 1), "stop_reason": search.stats.stop_reason,
                        "islands": a.islands, "generations": a.generations, "targets": tg,
                        "best_families": families, "per_shape": board.hgemm})


def merge() -> None:
    """The shards' per-shape rows as one table, with the issue's geomeans over all of them."""
    import json

    from _common import ROOT

    from cuforge.results.leaderboard import hgemm_targets

    shards = sorted((ROOT / "benchmarks" / "results").glob("hgemm_suite_shard*of*.json"))
    if not shards:
        raise SystemExit("no hgemm_suite_shard*.json results to merge")
    # One complete set only: shards of another split would count shapes twice or leave some out.
    found = {tuple(int(x) for x in p.stem.removeprefix("hgemm_suite_shard").split("of")) for p in shards}
    total = {n for _, n in found}
    if len(total) != 1 or {i for i, _ in found} != set(range(1, max(total) + 1)):
        raise SystemExit(f"shard results are not one complete set I/N: {sorted(found)}; remove stale ones")
    runs = [json.loads(p.read_text()) for p in shards]
    machines = {(r.get("gpu"), r.get("torch"), r.get("cuda")) for r in runs}
    if len(machines) != 1:
        raise SystemExit(f"shard results come from different machines or versions: {sorted(map(str, machines))}")
    gpu, torch_version, cuda = machines.pop()
    table = sorted((r for run in runs for r in run["per_shape"]), key=lambda r: (r["M"], r["N"], r["K"]))
    families: dict[str, int] = {}
    for run in runs:
        for fam, count in run["best_families"].items():
            families[fam] = families.get(fam, 0) + count
    # the machine the shards ran on, not the one merging them
    write_result("hgemm_suite", {"gpu": gpu, "torch": torch_version, "cuda": cuda,
                                 "suite": runs[0]["suite"], "shards": [p.name for p in shards],
                                 "evaluations": sum(r["evaluations"] for r in runs),
                                 "wall_s": round(sum(r["wall_s"] for r in runs), 1),
                                 "stop_reasons": sorted({r["stop_reason"] for r in runs}),
                                 "generations": runs[0]["generations"], "targets": hgemm_targets(table),
                                 "best_families": families, "per_shape": table})


def describe(c: dict | None) -> str:
    """A best config in a few words: tile, split-K and its reduction, multicast cluster, one consumer
    warpgroup, epilogue, stages."""
    if not c:
        return "-"
    if c.get("family") == "gemm_sm80":
        return f"sm80 {c['BM']}x{c['BN']}x{c['BK']}, {c['STAGES']} st"
    split = f" split {c['SPLIT_K']} {c['REDUCE']}" if c.get("SPLIT_K", 1) > 1 else ""
    cluster = c.get("CLUSTER_M", 1), c.get("CLUSTER_N", 1)
    multicast = f" multicast {cluster[0]}x{cluster[1]}" if cluster != (1, 1) else ""
    one = " 1 consumer" if c.get("ONE_CONSUMER") else ""
    return f"{c['BM']}x{c['BN']}{split}{multicast}{one}, {c['EPI']}, {c['STAGES']} st"


def print_table() -> None:
    import json

    from _common import ROOT

    data = json.loads((ROOT / "benchmarks" / "results" / "hgemm_suite.json").read_text())
    print("| M | N | K | ours us | vs cuBLAS | vs cuBLASLt | CUDA-L2 reported | best config |")
    print("|---|---|---|---|---|---|---|---|")
    for r in data["per_shape"]:
        cells = [r["M"], r["N"], r["K"], f"{r['best_ms'] * 1000:.2f}", f"{r['measured_vs_cublas']:.3f}",
                 f"{r['measured_vs_cublaslt']:.3f}",
                 "-" if r["cuda_l2_reported_vs_cublas"] is None else f"{r['cuda_l2_reported_vs_cublas']:.3f}",
                 describe(r["best_config"])]
        print("| " + " | ".join(map(str, cells)) + " |")


if __name__ == "__main__":
    main()
