"""The `cuforge` command line: parses, calls one function of the modules below, prints."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, NoReturn, Optional

import typer
from rich.console import Console
from rich.table import Table

from cuforge import __version__

app = typer.Typer(
    help="cuforge: make GPU kernels faster by search, with an honest sandbox.",
    no_args_is_help=True,
    add_completion=False,
)
problems_app = typer.Typer(help="List, show and validate problems and suites.", no_args_is_help=True)
app.add_typer(problems_app, name="problems")

console = Console()
err_console = Console(stderr=True)

# Exit codes: 0 success, 1 the command ran and found failures, 2 bad input or environment.
EXIT_FAILURES = 1
EXIT_BAD_INPUT = 2


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def _fmt_num(x: float | None, unit: str = "") -> str:
    if x is None:
        return "?"
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{suffix}{unit}"
    return f"{x:.3g}{unit}"


@app.callback(invoke_without_command=True)
def main(version: bool = typer.Option(False, "--version", help="Print the version and exit.")) -> None:
    if version:
        console.print(f"cuforge {__version__}")
        raise typer.Exit(0)


@app.command()
def doctor(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Report Python, torch, CUDA, GPUs, nvcc, NVRTC, ncu, API keys (names only) and sandbox isolation."""
    from cuforge.doctor import run_doctor

    report = run_doctor()
    if as_json:
        emit_json(report.to_dict())
        return
    table = Table(title="cuforge doctor", show_lines=False)
    for col in ("check", "status", "detail", "fix"):
        table.add_column(col, overflow="fold")
    for c in report.checks:
        table.add_row(c.name, "[green]ok[/]" if c.ok else "[red]missing[/]", c.detail, c.fix)
    console.print(table)
    for g in report.gpus:
        console.print(f"GPU {g['index']}: {g['name']}, {g['sm_count']} SMs, sm_{g['compute_capability'].replace('.', '')}, "
                      f"{g['memory_gib']} GiB, L2 {g['l2_mib']} MiB")
    console.print("ready for GPU runs" if report.ready_for_gpu_runs else
                  "[yellow]not ready for GPU runs[/] (CPU-only work: tests, problems, --compile-only)")


@problems_app.command("list")
def problems_list(
    suite: Optional[str] = typer.Option(None, "--suite", "-s", help="Built-in suite name or a directory of problem files."),
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
        console.print(table)
        return
    try:
        with console.status(f"loading {suite} ...", spinner="dots"):
            loaded = load_suite(suite)
    except ProblemError as e:
        fail(str(e))
    if as_json:
        emit_json({"suite": loaded.name, "problems": [_problem_row(p) for p in loaded.problems],
                   "skipped": [{"path": s.path, "reason": s.reason} for s in loaded.skipped]})
        return
    table = Table(title=f"{loaded.name}: {len(loaded.problems)} problems")
    for col in ("id", "dtype", "shapes", "GFLOP", "MB", "family", "policy"):
        table.add_column(col, overflow="fold")
    for p in loaded.problems:
        r = _problem_row(p)
        table.add_row(p.id, r["dtype"] or "?", p.shapes_summary(), _fmt_num(p.meta.flops and p.meta.flops / 1e9),
                      _fmt_num(p.meta.bytes and p.meta.bytes / 1e6), ",".join(p.meta.families) or "?", p.meta.policy)
    console.print(table)
    _print_skipped(loaded.skipped)


def _problem_row(p: Any) -> dict[str, Any]:
    return {"id": p.id, "dtype": p.meta.dtype, "shapes": p.shapes_summary(), "flops": p.meta.flops,
            "bytes": p.meta.bytes, "families": list(p.meta.families), "policy": p.meta.policy}


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
    console.print(Syntax(problem.source, "python", line_numbers=True))
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
    console.print(t)


@problems_app.command("validate")
def problems_validate(
    target: Path = typer.Argument(..., help="A problem file or a directory of them."),
    timeout: float = typer.Option(60.0, help="Seconds allowed per file (import, inputs, reference run)."),
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
    elif target.is_file():
        paths = [target]
    else:
        fail(f"{target}: no such file or directory")
    if not paths:
        fail(f"{target}: no problem files (*.py) found")
    with console.status("validating ...") as status:
        results = validate_files(paths, timeout, on_file=lambda p: status.update(f"validating {p.name} ..."))
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


if __name__ == "__main__":
    app()
