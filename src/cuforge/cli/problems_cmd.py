"""`cuforge problems list|show|validate`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table

from cuforge.cli.app import EXIT_FAILURES, console, emit_json, err_console, fail, inspecting, show_table
from cuforge.cli.app import problems_app
from cuforge.fmt import si as _fmt_num


@problems_app.command("list")
def problems_list(
    suite: Optional[str] = typer.Option(None, "--suite", "-s", help="Built-in suite name or a directory of problem files."),
    timeout: float = typer.Option(180.0, min=1, max=3600, help="Seconds one file's import and trace may take; a file "
                                  "past it is listed as skipped."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """List built-in suites, or the problems of one suite."""
    from cuforge.problems.problem import ProblemError
    from cuforge.problems.suites import builtin_suite_names, load_suite, suite_description

    if suite is None:
        rows = [{"suite": n, "description": suite_description(n)} for n in builtin_suite_names()]
        if as_json:
            emit_json(rows)
            return
        table = Table(title="built-in suites (or pass a directory of problem files)")
        table.add_column("suite")
        table.add_column("description")
        for r in rows:
            table.add_row(r["suite"], r["description"])
        show_table(table)
        return
    try:
        with inspecting(suite) as on_file:
            loaded = load_suite(suite, timeout, on_file)
    except ProblemError as e:
        fail(str(e))
    if as_json:
        emit_json({"suite": loaded.name, "problems": [_problem_row(p) for p in loaded.problems],
                   "skipped": [{"path": s.path, "reason": s.reason} for s in loaded.skipped]})
        return
    rows = [_problem_row(p) for p in loaded.problems]
    covered = sum(1 for r in rows if r["offline"])
    table = Table(title=f"{loaded.name}: {len(loaded.problems)} problems, {covered} covered by the offline search")
    for col in ("id", "dtype", "shapes", "GFLOP", "MB", "policy", "offline search"):
        table.add_column(col, overflow="fold")
    for p, r in zip(loaded.problems, rows):
        table.add_row(p.id, r["dtype"] or "?", p.shapes_summary(), _fmt_num(p.meta.flops and p.meta.flops / 1e9),
                      _fmt_num(p.meta.bytes and p.meta.bytes / 1e6), p.meta.policy,
                      ", ".join(r["offline"]) or "not covered (problems show says why)")
    show_table(table)
    _print_skipped(loaded.skipped)


def _problem_row(p: Any) -> dict[str, Any]:
    from cuforge.kernels.families import families_for

    families, why = families_for(p)
    return {"id": p.id, "dtype": p.meta.dtype, "shapes": p.shapes_summary(), "flops": p.meta.flops,
            "bytes": p.meta.bytes, "families": list(p.meta.families), "policy": p.meta.policy,
            # what the offline search would use (first: preferred), or why nothing covers it
            "offline": [f.name for f in families], "not_covered": why or None,
            "parts": families[0].describe(p) if families and families[0].name == "partition" else None}  # type: ignore[attr-defined]


def _print_skipped(skipped: list[Any]) -> None:
    for s in skipped:
        err_console.print(f"[yellow]skipped[/] {s.path}: {s.reason}", highlight=False, soft_wrap=True)


@problems_app.command("show")
def problems_show(
    ref: str = typer.Argument(..., help="hgemm/M_N_K, level1/NAME, level2/NAME, or a path to a problem file."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Show a problem: source, shapes, dtypes, FLOPs, bytes, family, policy, tolerance."""
    from rich.syntax import Syntax

    from cuforge.problems.problem import ProblemError
    from cuforge.problems.suites import load_problem

    try:
        problem = load_problem(ref)
    except ProblemError as e:
        fail(str(e))
    if as_json:
        emit_json(problem.to_dict())
        return
    m = problem.meta
    if console.is_terminal:
        console.print(Syntax(problem.source, "python", line_numbers=True))
    else:  # whole lines, numbered, no wrapping: what a pager or a script reads
        lines = problem.source.splitlines()
        width = len(str(len(lines)))
        console.file.write("".join(f"{i:>{width}}  {line}\n" for i, line in enumerate(lines, 1)))
    t = Table(show_header=False, title=problem.id)
    t.add_column("field")
    t.add_column("value", overflow="fold")
    t.add_row("shapes", problem.shapes_summary())
    t.add_row("dtype", m.dtype or "?")
    t.add_row("FLOPs", _fmt_num(m.flops))
    t.add_row("bytes (minimal)", _fmt_num(m.bytes, "B"))
    t.add_row("intensity", f"{m.arithmetic_intensity:.2f} FLOP/B" if m.arithmetic_intensity else "?")
    t.add_row("families", ", ".join(m.families) or "?")
    t.add_row("policy", m.policy)
    t.add_row("baselines", ", ".join(m.baselines))
    t.add_row("tolerance", f"atol {m.tolerance.atol:g}, rtol {m.tolerance.rtol:g}, rel-norm {m.tolerance.rel_norm:g}")
    if m.derived:
        t.add_row("derived", ", ".join(m.derived))
    if m.unknown:
        t.add_row("unknown", ", ".join(m.unknown) + " (declare them in CUFORGE)")
    t.add_row("offline search", _coverage(problem))
    show_table(t)


def _coverage(problem: Any) -> str:
    """Which template families the offline search would use, or the whole reason none covers it."""
    from cuforge.kernels.families import families_for

    families, why = families_for(problem)
    if families and families[0].name == "partition":  # which parts are kernels and which stay PyTorch's
        return f"partition: {families[0].describe(problem)}"  # type: ignore[attr-defined]
    return ", ".join(f.name for f in families) if families else why


@problems_app.command("validate")
def problems_validate(
    target: Path = typer.Argument(..., help="A problem file or a directory of them."),
    timeout: float = typer.Option(180.0, min=1, max=3600, help="Seconds allowed per file (import, inputs, reference run)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Load each file in a subprocess, check its interface and run its reference once on the CPU."""
    from cuforge.problems.loader import problem_files_in, validate_files
    from cuforge.problems.problem import ProblemError

    if target.is_dir():
        try:
            paths = problem_files_in(target)
        except ProblemError as e:
            fail(str(e))
    elif target.is_file() or target.exists():  # anything else is refused with its reason by the loader
        paths = [target]
    else:
        fail(f"{target}: no such file or directory")
    if not paths:
        fail(f"{target}: no problem files (*.py) found")
    with inspecting(str(target)) as on_file:
        results = validate_files(paths, timeout, on_file=on_file)
    bad = [r for r in results if not r[1]]
    if as_json:
        emit_json([{"path": str(p), "ok": ok, "message": msg} for p, ok, msg, _ in results])
    else:
        for p, ok, msg, _ in results:
            mark = "[green]ok[/]  " if ok else "[red]bad[/] "
            console.print(f"{mark} {p}: {msg}", highlight=False, soft_wrap=True)
        console.print(f"{len(results) - len(bad)} valid, {len(bad)} invalid")
    if bad:
        raise typer.Exit(EXIT_FAILURES)
