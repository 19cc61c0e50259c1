"""Reading a run's winners out of the store into an export Plan (the I/O edge of plan.py)."""

from __future__ import annotations

import datetime
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from cuforge import __version__
from cuforge.export.plan import (FALLBACK_BASELINES, Entry, ExportError, Kernel, NotExportable, Op, Plan, lower,
                                 op_name_of)
from cuforge.problems.hgemm import hgemm_problem, parse_hgemm_id
from cuforge.problems.problem import Problem, ProblemError
from cuforge.results.store import Store, problem_hash
from cuforge.sandbox.protocol.candidate import Candidate


def resolve_problems(store: Store, run_id: str, suite: str | None) -> dict[str, Problem]:
    """The run's problems as they were: from the source the store kept, else from the suite (checked
    against the stored hash, so a changed problem file is refused rather than exported wrongly)."""
    from cuforge.problems.loader import load_files

    out: dict[str, Problem] = {}
    wanted = store.run_problem_sources(run_id)
    suite_problems: dict[str, Problem] | None = None
    for pid, (phash, source) in sorted(wanted.items()):
        dims = parse_hgemm_id(pid) if pid.startswith("hgemm/") else None
        if dims:
            out[pid] = hgemm_problem(*dims)
            continue
        if source is not None:
            with tempfile.TemporaryDirectory(prefix="cuforge-export-") as d:
                path = Path(d) / (pid.rsplit("/", 1)[-1].removesuffix(".py") + ".py")
                path.write_text(source)
                loaded, skipped = load_files([path])
            if skipped:
                raise ExportError(f"problem {pid} no longer loads: {skipped[0].reason}")
            out[pid] = replace(loaded[0], id=pid, path=None)
            continue
        if suite_problems is None:
            from cuforge.problems.suites import load_suite

            try:
                suite_problems = {p.id: p for p in load_suite(suite or "").problems}
            except ProblemError as e:
                raise ExportError(f"run {run_id} predates stored problem sources and its suite is gone: {e}") from None
        p = suite_problems.get(pid)
        if p is None or problem_hash(p.source) != phash:
            raise ExportError(f"problem {pid} is not in suite {suite!r} as it was during run {run_id}")
        out[pid] = p
    return out


def fallback_speedup(speedups: dict[str, float]) -> float | None:
    """The speedup over the slowest-to-beat fallback the run measured (torch eager, cuBLAS)."""
    seen = [speedups[b] for b in FALLBACK_BASELINES if b in speedups]
    return min(seen) if seen else None


def provenance(store: Store, run_id: str) -> dict[str, Any]:
    run = store.run(run_id)
    cfg = run.config or {}
    proposers = [{"provider": p.get("provider"), "model": p.get("model", "")} for p in cfg.get("proposers", [])]
    return {"run_id": run.id, "suite": run.suite, "status": run.status, "gpu": run.gpu, "software": run.software,
            "run_started": datetime.datetime.fromtimestamp(run.created_at, datetime.timezone.utc)
            .isoformat(timespec="seconds"), "proposers": proposers, "cuforge": __version__}


def build_plan(store: Store, run_id: str, min_speedup: float = 1.0) -> Plan:
    run = store.run(run_id)
    problems = resolve_problems(store, run_id, run.suite)
    ranked: dict[str, list[tuple[float, dict[str, Any], Candidate]]] = {}
    notes: dict[str, str] = {}
    for row in store.evaluations(run_id):
        if row["status"] != "ok" or row["problem_id"] not in problems:
            continue
        score = fallback_speedup(row["speedups"])
        if score is None:
            continue
        cand = Candidate.from_dict(store.candidate_source(row["candidate_id"]))
        if cand.format != "kernel":
            if score > max((r[0] for r in ranked.get(row["problem_id"], [])), default=0.0):
                notes[row["problem_id"]] = f"its best candidate ({score:.3f}x) is a Python module, not a standalone kernel"
            continue
        ranked.setdefault(row["problem_id"], []).append((score, row, cand))
    ops: dict[str, Op] = {}
    kernels: dict[str, Kernel] = {}
    for pid, problem in sorted(problems.items()):
        name, kind = op_name_of(problem)
        op = ops.get(name)
        signature = (tuple(t.dtype for t in problem.inputs), tuple(len(t.shape) for t in problem.inputs),
                     tuple(t.dtype for t in problem.outputs or ()))
        if op is None:
            op = ops[name] = Op(name, kind, *signature, reference_source=problem.source,
                                tolerance={"atol": problem.meta.tolerance.atol, "rtol": problem.meta.tolerance.rtol})
        elif (op.input_dtypes, op.input_ranks, op.output_dtypes) != signature:
            raise ExportError(f"problems {op.entries[0].problem_id if op.entries else '?'} and {pid} both export as "
                              f"op {name!r} with different signatures")
        _add_entry(op, kernels, problem, sorted(ranked.get(pid, []), key=lambda r: -r[0]), notes.get(pid), min_speedup)
    for op in ops.values():
        op.entries.sort(key=lambda e: e.shapes)
    return Plan(provenance(store, run_id), [ops[k] for k in sorted(ops)], dict(sorted(kernels.items())))


def _add_entry(op: Op, kernels: dict[str, Kernel], problem: Problem,
               ranked: list[tuple[float, dict[str, Any], Candidate]], note: str | None, min_speedup: float) -> None:
    """The fastest candidate that can be exported (a faster one that cannot is named in the note)."""
    shapes = tuple(tuple(t.shape) for t in problem.inputs)
    left = {"problem_id": problem.id, "shapes": [list(x) for x in shapes]}
    if not ranked:
        op.skipped.append({**left, "reason": note or "no correct kernel-format candidate in the run"})
        return
    unexportable: list[str] = []
    for score, row, cand in ranked:
        if score < min_speedup:
            why = f"best kernel {score:.3f}x of the fallback (< {min_speedup:g}x): the fallback is faster"
            extra = [note] if note else []
            extra += [f"faster kernels not exportable: {unexportable[0]}"] if unexportable else []
            op.skipped.append({**left, "reason": "; ".join([why, *extra])})
            return
        try:
            kernel, launch = lower(problem, cand, int(row["device"].get("sm_count") or 132))
        except NotExportable as e:
            unexportable.append(f"{score:.3f}x ({e})")
            continue
        kernels.setdefault(kernel.symbol, replace(kernel, candidate_id=row["candidate_id"], config=cand.meta.get("config")))
        cand_ms = row["median_ms"] or 0.0
        timings = {"candidate": cand_ms, **{b: round(s * cand_ms, 6) for b, s in row["speedups"].items()}}
        op.entries.append(Entry(shapes, kernel.symbol, launch["grid"], launch["block"], launch["shared_mem"],
                                launch["args"], launch["outputs"], problem.id,
                                {k: round(v, 4) for k, v in sorted(row["speedups"].items())}, timings))
        if unexportable:
            op.notes.append(f"{problem.id}: a faster kernel was not exportable: {unexportable[0]}")
        return
    op.skipped.append({**left, "reason": "no exportable kernel: " + unexportable[0]})
