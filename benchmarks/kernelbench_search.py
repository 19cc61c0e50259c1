"""Issue #23: the offline template search on KernelBench's own level1/level2 files.

Coverage (CPU, no GPU): which files some kernel family matches by its traced graph, and why the
others are not matched. Search (GPU): the template search over the covered files of a level, each
best kernel timed again beside eager PyTorch and torch.compile in one worker.

    python benchmarks/kernelbench_search.py --coverage --levels 1,2 --name kb_coverage
    python benchmarks/kernelbench_search.py --levels 1 --families pointwise,reduce_dim,scan_rows \
        --generations 2 --name kb_search_l1
    python benchmarks/kernelbench_search.py --levels 1 --files 55_,56_ --precision pytorch --name kb_search_l1_pytorch
    python benchmarks/kernelbench_search.py --levels 1,2 --precision pytorch --shard 0/4 --wall-time 400 \
        --recheck-deadline 120 --name kb_search_pytorch_0of4      # a quarter of both levels, on every GPU
    python benchmarks/kernelbench_search.py --levels 1,2 --flag-dependent --precision pytorch --shard 0/3 \
        --wall-time 300 --recheck-deadline 150 --name kb_search_pytorch_conv_0of3   # the 98 convolutions' first third

    python benchmarks/kernelbench_search.py --recheck kb_search_pytorch_library_rest_s66 \
        --name kb_search_pytorch_library_rest_recheck   # the rows its recheck deadline left un-timed

Results: benchmarks/results/NAME.json (and $OUT/NAME.json).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

from _common import write_result
from kernelbench import KB, prevalidate


def files_of(levels: list[str], prefixes: list[str], shard: tuple[int, int] = (0, 1)) -> list[tuple[str, Path]]:
    """KernelBench's files of `levels` in numeric order whose names start with one of `prefixes` (all
    where none): a prefix `2/1_` names level 2's files only, a plain `1_` every level's. `shard` (i, n)
    keeps every n-th file from the i-th, so n calls share the files out."""
    want = [p.partition("/")[::2] if "/" in p else ("", p) for p in prefixes]
    out = []
    for level in levels:
        for path in sorted((KB / f"level{level}").glob("*.py"), key=lambda p: (len(p.name.split("_")[0]), p.name)):
            if not want or any(lv in ("", level) and path.name.startswith(x) for lv, x in want):
                out.append((level, path))
    i, n = shard
    return out[i::n]


def parse_shard(text: str) -> tuple[int, int]:
    """--shard I/N (0 <= I < N) -> (I, N); anything else exits naming the expected form."""
    i, sep, n = text.partition("/")
    if not (sep and i.isdigit() and n.isdigit() and 0 <= int(i) < int(n)):
        raise SystemExit(f"--shard {text}: expected I/N with 0 <= I < N, e.g. 0/4")
    return int(i), int(n)


def flags_change(problem) -> bool:
    """Whether the two flag sets run the problem's traced ops differently (precision.flags_matter), so a
    contract other than fp32 can differ from it. A problem whose own code touches the TF32 switches counts
    as turning matmul TF32 on (the judge reads the switches when it loads the module; a trace does not)."""
    from cuforge.sandbox.protocol.precision import flags_matter

    own = "allow_tf32" in problem.source or "set_float32_matmul_precision" in problem.source
    return flags_matter(problem.ops, problem.meta.dtype, {"matmul.allow_tf32": True} if own else None)


def flag_dependent(chosen: list[tuple[str, Path]]) -> list[tuple[str, Path]]:
    """The chosen files the flag sets change (flags_change). A file that does not load is kept (the search
    says why)."""
    from cuforge.problems.loader import load_files

    problems, _ = load_files([p for _, p in chosen])
    free = {str(p.path) for p in problems if not flags_change(p)}
    return [(level, path) for level, path in chosen if str(path) not in free]


def coverage(chosen: list[tuple[str, Path]]) -> dict:
    """Per file: the families that cover it (first = preferred) or why none does."""
    from cuforge.kernels.families import families_for
    from cuforge.problems.loader import load_files

    rows = []
    for level, path in chosen:
        problems, skipped = load_files([path])
        if skipped:
            rows.append({"level": level, "file": path.name, "families": [], "why": f"not loaded: {skipped[0].reason}"})
            continue
        fams, why = families_for(problems[0])
        # whether the precision flags change what eager runs for it (kernelbench_search_summary reads it)
        rows.append({"level": level, "file": path.name, "families": [f.name for f in fams], "why": why[:400],
                     "flags_matter": flags_change(problems[0])})
    summary = {}
    for level in sorted({r["level"] for r in rows}):
        mine = [r for r in rows if r["level"] == level]
        covered = [r for r in mine if r["families"]]
        summary[f"level{level}"] = {"files": len(mine), "covered": len(covered),
                                    "by_family": dict(Counter(r["families"][0] for r in covered))}
    return {"summary": summary, "rows": rows}


def search(chosen: list[tuple[str, Path]], families: set[str], generations: int, max_timing: float,
           precision: str = "fp32", wall_time: float | None = None, gpus: str = "all",
           recheck_deadline: float | None = None, checkpoint=None) -> dict:
    """The template search over the chosen files that a wanted family covers; leaderboard rows, then
    each best kernel re-timed beside eager and torch.compile. `checkpoint(rows)` is called with the
    search's rows before the recheck starts, so a run cut short in the recheck keeps them (and
    `--recheck` can re-time them later)."""
    from level_suites import failures_by_problem, time_against_torch_compile

    from cuforge.agent.config import RunConfig
    from cuforge.agent.run import execute
    from cuforge.kernels.families import families_for
    from cuforge.problems.suites import load_suite
    from cuforge.results.leaderboard import build_leaderboard
    from cuforge.results.store import Store
    from cuforge.rewards import fast_p, geomean

    work = Path(tempfile.mkdtemp(prefix="cuforge-kb-search-"))
    suite_dir = work / "kernelbench"
    suite_dir.mkdir()
    for level, path in chosen:
        shutil.copy(path, suite_dir / f"l{level}_{path.name}")
    problems = load_suite(str(suite_dir)).problems
    preferred = {p.id: families_for(p)[0] for p in problems}
    covered = {pid: fams[0].name for pid, fams in preferred.items() if fams}
    # "staged" picks every two-kernel family (staged:head+tail).
    wanted = sorted(pid for pid, fam in covered.items() if not families or fam in families or fam.split(":")[0] in families)
    store = Store(str(work / "cuforge.db"))
    cfg = RunConfig(suite=str(suite_dir), problems=wanted, islands=1, generations=generations, baseline="torch",
                    max_timing_s=max_timing, precision=precision, wall_time_s=wall_time, gpus=gpus)
    t0 = time.perf_counter()
    run_id, searched = execute(cfg, store, None, False)
    board = build_leaderboard(store.evaluations(run_id), store.run_problems(run_id), run_id, "torch")
    failures = failures_by_problem(store, run_id)
    by_family = best_ms_by_family(store, run_id)
    phases = phases_by_problem(store, run_id)
    rows = [{"problem": r.problem_id, "family": covered.get(r.problem_id), "evaluations": r.evaluations, "correct": r.correct,
             # every ratio the search timed beside its best kernel (torch.compile on a GPU; eager and
             # torch.compile under the other contract's flags where those change what runs); a recheck
             # replaces them
             **{f"vs_{k}": v for k, v in r.speedups_of_best.items()},
             "vs_torch": r.speedups_of_best.get("torch"), "vs_torch_compile": r.speedups_of_best.get("torch.compile"),
             "best_ms": r.best_median_ms,
             "best_candidate_id": r.best_candidate_id, "best_config": best_config(store, r.best_candidate_id),
             "failures": failures.get(r.problem_id, []), "best_ms_by_family": by_family.get(r.problem_id, {}),
             "evaluations_s": phases.get(r.problem_id, [])}
            for r in board.rows]
    if checkpoint is not None:
        checkpoint({"problems": len(wanted), "generations": generations, "precision": precision,
                    "stop_reason": searched.stats.stop_reason, "evaluations": searched.stats.evaluations,
                    "rows": [{**r, "recheck": {"status": "not re-timed: the run ended before its recheck"}} for r in rows]})
    # the recheck on the GPUs the search used (every visible one for "all"), a worker each
    recheck_gpus = list(range(max(1, torch_device_count()))) if gpus == "all" else [int(g) for g in gpus.split(",")]
    deadline = None if recheck_deadline is None else time.monotonic() + recheck_deadline
    time_against_torch_compile(store, {p.id: p.under(precision) for p in problems}, rows, precision, recheck_gpus, deadline)
    for r in rows:  # the side-by-side recheck is the number reported
        if r.get("recheck", {}).get("status") == "ok":
            r["vs_torch"] = r["recheck"]["vs_torch"]
    best = {r["problem"]: r["vs_torch"] for r in rows}
    compiled = {r["problem"]: r["vs_torch_compile"] for r in rows}
    return {"problems": len(wanted), "generations": generations, "precision": precision, "stop_reason": searched.stats.stop_reason,
            "wall_s": round(time.perf_counter() - t0, 1),
            "evaluations": searched.stats.evaluations, "fast_1_vs_torch": fast_p(best, wanted, 1.0),
            "fast_1_vs_torch_compile": fast_p(compiled, wanted, 1.0),
            "geomean_vs_torch": geomean(v for v in best.values() if v),
            "geomean_vs_torch_compile": geomean(v for v in compiled.values() if v), "rows": rows}


def problem_files(rows: list[dict]) -> list[tuple[str, Path]]:
    """The KernelBench files (level, path) a search record's rows name (`kernelbench/l2_57_Name`)."""
    out = []
    for r in rows:
        level, _, name = r["problem"].split("/", 1)[1].partition("_")
        path = KB / f"level{level.removeprefix('l')}" / f"{name}.py"
        if not path.is_file():
            raise SystemExit(f"--recheck: {r['problem']} is not a KernelBench file here ({path})")
        out.append((level.removeprefix("l"), path))
    return out


def unchecked_rows(record: dict) -> list[dict]:
    """A search record's rows whose best kernel was not re-timed (its recheck deadline passed, or it
    failed) and whose config is known, to re-time now."""
    return [dict(r) for r in record["search"]["rows"]
            if r.get("recheck", {}).get("status") != "ok" and r.get("best_config")]


def rendered_best(rows: list[dict], problems: dict) -> dict:
    """Each row's best kernel rendered again from its recorded config (a family's render is a pure
    function of config and problem, so this is the source the search timed), by its candidate id."""
    from cuforge.kernels.base import config_of
    from cuforge.kernels.families import families_for

    out = {}
    for r in rows:
        cfg = dict(r["best_config"])
        problem = problems[r["problem"]]
        family = next((f for f in families_for(problem)[0] if f.name == cfg.get("family")), None)
        if family is None:
            raise SystemExit(f"--recheck: no family {cfg.get('family')!r} covers {r['problem']} any more")
        cand = family.render({k: v for k, v in cfg.items() if k != "family"}, problem)
        rendered = config_of(cand.source) or {}
        if any(rendered.get(k) != v for k, v in r["best_config"].items()):  # a knob added since reads its default
            raise SystemExit(f"--recheck: {r['problem']}'s config does not render back to itself "
                             f"({rendered} against {r['best_config']})")
        out[r["best_candidate_id"]] = cand.to_dict()
    return out


def recheck(name: str, gpus: str = "all", deadline_s: float | None = None) -> dict:
    """The rows of search record `name` whose best kernel was not re-timed, re-timed now beside eager
    and torch.compile as the search's recheck does: a record of those rows alone (`rechecked_from`)."""
    from cuforge.problems.suites import load_suite

    path = Path(__file__).resolve().parent / "results" / f"{name}.json"
    if not path.is_file():
        raise SystemExit(f"--recheck: no record {path}")
    record = json.loads(path.read_text())
    if "search" not in record:
        raise SystemExit(f"--recheck: {name} is a coverage record, not a search's")
    precision = record["search"].get("precision", "fp32")
    rows = unchecked_rows(record)
    work = Path(tempfile.mkdtemp(prefix="cuforge-kb-recheck-"))
    suite_dir = work / "kernelbench"
    suite_dir.mkdir()
    for level, p in problem_files(rows):
        shutil.copy(p, suite_dir / f"l{level}_{p.name}")
    problems = {p.id: p.under(precision) for p in load_suite(str(suite_dir)).problems} if rows else {}
    sources = rendered_best(rows, problems)
    recheck_gpus = list(range(max(1, torch_device_count()))) if gpus == "all" else [int(g) for g in gpus.split(",")]
    deadline = None if deadline_s is None else time.monotonic() + deadline_s
    from level_suites import time_against_torch_compile

    time_against_torch_compile(None, problems, rows, precision, recheck_gpus, deadline, sources=sources)
    for r in rows:
        if r.get("recheck", {}).get("status") == "ok":
            r["vs_torch"] = r["recheck"]["vs_torch"]
    return {"rechecked_from": name, "problems": len(rows), "precision": precision, "rows": rows}


def best_config(store, candidate_id: int | None) -> dict | None:
    """The family config a best kernel was rendered from (None where there is no best)."""
    from cuforge.kernels.base import config_of

    return None if candidate_id is None else config_of(store.candidate_source(candidate_id)["source"]) or None


def phases_by_problem(store, run_id: str) -> dict[str, list[dict]]:
    """Each problem's evaluations, oldest first: status, wall seconds and the judge's phases (load,
    reference, correctness, timing): where an evaluation's time goes, read from the store."""
    out: dict[str, list[dict]] = {}
    rows = store.conn.execute("SELECT problem_id, status, wall_s, correctness FROM evaluations WHERE run_id = ? ORDER BY id",
                              (run_id,))
    for problem_id, status, wall_s, correctness in rows:
        phases = (json.loads(correctness) if correctness else {}).get("judge_phases_s", {})
        out.setdefault(problem_id, []).append({"status": status, "wall_s": wall_s, "phases_s": phases})
    return out


def best_ms_by_family(store, run_id: str) -> dict[str, dict[str, float]]:
    """Per problem, each family's fastest correct kernel (ms, the search's own timing): what a family
    that tried and lost achieved, which the best row alone does not show."""
    from cuforge.kernels.base import config_of

    out: dict[str, dict[str, float]] = {}
    for e in store.evaluations(run_id):
        if e["status"] != "ok" or e["median_ms"] is None:
            continue
        family = (config_of(store.candidate_source(e["candidate_id"])["source"]) or {}).get("family", "?")
        mine = out.setdefault(e["problem_id"], {})
        mine[family] = min(mine.get(family, e["median_ms"]), e["median_ms"])
    return out


def torch_device_count() -> int:
    import torch

    return torch.cuda.device_count()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--levels", default="1,2")
    ap.add_argument("--files", default="", help="comma list of file-name prefixes (19_,20_; 2/1_ for level 2's only)")
    ap.add_argument("--shard", default="0/1", help="I/N: every N-th chosen file from the I-th (N calls share them)")
    ap.add_argument("--wall-time", type=float, default=None, help="the search's wall-clock limit in seconds")
    ap.add_argument("--recheck-deadline", type=float, default=None,
                    help="seconds after the search past which no more best kernels are re-timed (named in the rows)")
    ap.add_argument("--gpus", default="all", help="GPUs the search and the recheck use: all, or indices 0,1")
    ap.add_argument("--flag-dependent", action="store_true", help="only the files whose traced ops the precision "
                    "flags change (a convolution; a matmul in half precision or with TF32 turned on), before sharding")
    ap.add_argument("--coverage", action="store_true", help="coverage only (no GPU)")
    ap.add_argument("--families", default="", help="search only files whose preferred family is one of these "
                                                    "(staged: every two-kernel family)")
    ap.add_argument("--generations", type=int, default=2)
    ap.add_argument("--max-timing", type=float, default=1.0)
    ap.add_argument("--inspectors", type=int, default=8)
    ap.add_argument("--precision", default="fp32", help="the precision contract searched and timed under "
                                                          "(fp32, pytorch, kernelbench)")
    ap.add_argument("--recheck", metavar="RECORD", help="no search: re-time the best kernels of search record "
                    "RECORD that its recheck left un-timed, rendered again from their configs (--gpus, "
                    "--recheck-deadline apply)")
    ap.add_argument("--name", default="kernelbench_search")
    a = ap.parse_args()
    os.environ.setdefault("CUFORGE_CACHE_DIR", tempfile.mkdtemp(prefix="cuforge-bench-cache-"))
    if a.recheck:
        if a.recheck == a.name:
            raise SystemExit("--recheck: name the new record (--name) apart from the one re-timed")
        out = {"search": recheck(a.recheck, a.gpus, a.recheck_deadline)}
        for r in out["search"]["rows"]:
            print(f"  {r['problem']}: {r.get('recheck')}", flush=True)
        write_result(a.name, out)
        return
    chosen = files_of([x for x in a.levels.split(",") if x], [x for x in a.files.split(",") if x])
    if a.flag_dependent:
        chosen = flag_dependent(chosen)
    i, n = parse_shard(a.shard)
    chosen = chosen[i::n]
    prevalidate([p for _, p in chosen], a.inspectors)
    out: dict = {"coverage": coverage(chosen)}
    print(out["coverage"]["summary"], flush=True)
    if not a.coverage:
        def checkpoint(partial: dict) -> None:
            write_result(a.name, {**out, "search": partial}, echo=False)

        out["search"] = search(chosen, {x for x in a.families.split(",") if x}, a.generations, a.max_timing, a.precision,
                               a.wall_time, a.gpus, a.recheck_deadline, checkpoint)
        s = out["search"]
        print(f"{s['problems']} problems: fast_1 vs eager {s['fast_1_vs_torch']:.2f}, vs torch.compile "
              f"{s['fast_1_vs_torch_compile']:.2f}, geomean vs eager {s['geomean_vs_torch']}", flush=True)
        for r in s["rows"]:
            print(f"  {r['problem']} [{r['family']}]: vs eager {r['vs_torch']}, vs torch.compile {r['vs_torch_compile']}", flush=True)
            for f in r["failures"]:
                print(f"      {f}", flush=True)
    write_result(a.name, out)


if __name__ == "__main__":
    main()
