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
results_app = typer.Typer(help="Runs in the results store: list and export.", no_args_is_help=True)
app.add_typer(results_app, name="results")

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


def _parse_baselines(value: Optional[str], problem: Any) -> tuple[str, ...]:
    from cuforge.problems.problem import BASELINES

    if value is None:
        return tuple(problem.meta.baselines)
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    bad = [n for n in names if n not in BASELINES]
    if bad:
        fail(f"unknown baseline(s) {', '.join(bad)}; choose from {', '.join(BASELINES)}")
    return names


@app.command("eval")
def eval_cmd(
    problem_ref: str = typer.Argument(..., metavar="PROBLEM", help="hgemm/M_N_K, level1/NAME, or a problem file."),
    candidate_path: Path = typer.Argument(..., metavar="CANDIDATE.py", help="A Python file defining ModelNew."),
    baselines: Optional[str] = typer.Option(None, help="Comma-separated: torch, torch.compile, cublas, cublaslt "
                                            "(default: the problem's)."),
    trials: int = typer.Option(5, min=5, help="Correctness trials, each on fresh inputs."),
    compile_mode: str = typer.Option("default", help="torch.compile mode for that baseline: default or max-autotune."),
    timeout: float = typer.Option(300.0, help="Hard wall-clock limit for the evaluation, seconds."),
    gpu: int = typer.Option(0, help="GPU index."),
    cpu: bool = typer.Option(False, "--cpu", help="Harness test mode without a GPU: correctness only, wall-clock times."),
    ncu: bool = typer.Option(False, "--ncu", help="Also collect an Nsight Compute profile of the candidate."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Evaluate one candidate: correctness, anti-cheat, timing against each baseline, profile."""
    from cuforge.problems.problem import ProblemError
    from cuforge.problems.suites import load_problem
    from cuforge.sandbox.evaluate import candidate_from_file, supervisor_for
    from cuforge.sandbox.evaluation import EvalConfig
    from cuforge.sandbox.supervisor import WorkerStartError

    if not candidate_path.is_file():
        fail(f"{candidate_path}: no such file")
    try:
        problem = load_problem(problem_ref)
    except ProblemError as e:
        fail(str(e))
    if compile_mode not in ("default", "max-autotune", "max-autotune-no-cudagraphs", "reduce-overhead"):
        fail(f"unknown torch.compile mode {compile_mode!r}")
    config = EvalConfig(device="cpu" if cpu else "cuda", trials=trials, timeout_s=timeout, compile_mode=compile_mode,
                        baselines=_parse_baselines(baselines, problem))
    candidate = candidate_from_file(candidate_path)
    try:
        with console.status(f"evaluating {candidate_path.name} on {problem.id} ...", spinner="dots"):
            ev = supervisor_for(config, gpu).evaluate(problem, candidate, config)
            if ncu and ev.ok:
                from cuforge.sandbox.ncu import NcuError, ncu_profile

                try:
                    from cuforge.sandbox.evaluation import Profile
                    from cuforge.sandbox.profile import summarize

                    ev.profile = ev.profile or Profile()
                    ev.profile.ncu = ncu_profile(problem, candidate, gpu)
                    ev.profile.summary = summarize(ev.profile)
                except NcuError as e:
                    err_console.print(f"[yellow]ncu profile unavailable:[/] {e}", highlight=False)
    except WorkerStartError as e:
        fail(str(e))
    if as_json:
        emit_json(ev.to_dict())
    else:
        print_evaluation(ev)
    raise typer.Exit(0 if ev.ok else EXIT_FAILURES)


def print_evaluation(ev: Any) -> None:
    color = "green" if ev.ok else "red"
    console.print(f"[bold]{ev.problem_id}[/] candidate {ev.candidate_id}: [{color}]{ev.status}[/]"
                  + (f" - {ev.message}" if ev.message else ""), highlight=False, soft_wrap=True)
    for d in ev.diagnostics[:10]:
        console.print(f"  {d}", highlight=False)
    c = ev.correctness
    if c.get("trials_passed"):
        console.print(f"correctness: {c['trials_passed']}/{c.get('trials', c['trials_passed'])} trials vs {c.get('reference')} "
                      f"reference; max abs err {c.get('max_abs_err', 0):.3g}, rel-norm err {c.get('rel_norm_err', 0):.3g}")
    if ev.timings:
        t = Table(title="timings (interleaved, same worker)")
        for col in ("contender", "median ms", "p20 ms", "p80 ms", "n", "method", "speedup"):
            t.add_column(col)
        for name, st in ev.timings.items():
            sp = ev.speedup_vs(name) if name != "candidate" else None
            t.add_row(name, f"{st.median_ms:.4f}", f"{st.p20_ms:.4f}", f"{st.p80_ms:.4f}", str(st.n), st.method,
                      f"{sp:.3f}x" if sp else "")
        console.print(t)
    if c.get("baselines_skipped"):
        for name, why in c["baselines_skipped"].items():
            console.print(f"[yellow]baseline {name} skipped:[/] {why}", highlight=False)
    if ev.profile and ev.profile.summary:
        console.print("profile: " + ev.profile.summary, highlight=False)
    if ev.device.get("name"):
        console.print(f"device: {ev.device['name']} (torch {ev.device.get('torch')}, CUDA {ev.device.get('cuda')}); "
                      f"{ev.wall_s:.2f} s", highlight=False)


@app.command("baseline")
def baseline_cmd(
    suite: str = typer.Option(..., "--suite", "-s", help="Built-in suite or a directory of problem files."),
    problem: Optional[str] = typer.Option(None, "--problem", "-p", help="Only this problem id (or name)."),
    baselines: Optional[str] = typer.Option(None, help="Comma-separated baselines (default: each problem's)."),
    results: Path = typer.Option(Path("results/cuforge.db"), help="SQLite results store."),
    gpu: int = typer.Option(0, help="GPU index."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Measure baselines (eager, torch.compile, cuBLAS, cuBLASLt autotuned) for a suite and store them."""
    from rich.progress import Progress

    from cuforge.problems.problem import ProblemError
    from cuforge.problems.suites import load_suite
    from cuforge.results.store import Store, StoreError
    from cuforge.sandbox.baseline_run import measure_baselines, software_tag
    from cuforge.sandbox.evaluate import supervisor_for
    from cuforge.sandbox.evaluation import EvalConfig
    from cuforge.sandbox.supervisor import WorkerStartError

    try:
        loaded = load_suite(suite)
    except ProblemError as e:
        fail(str(e))
    chosen = [p for p in loaded.problems if problem in (None, p.id, p.name)]
    if not chosen:
        fail(f"no problem {problem!r} in {loaded.name}")
    try:
        store = Store(results)
    except StoreError as e:
        fail(str(e))
    rows, failures = [], 0
    with Progress(console=err_console) as progress:
        task = progress.add_task("baselines", total=len(chosen))
        for p in chosen:
            wanted = tuple(b for b in _parse_baselines(baselines, p) if b != "torch")
            config = EvalConfig(baselines=wanted, profile=False)
            try:
                sup = supervisor_for(config, gpu)
                ev = measure_baselines(sup, p, config)
            except WorkerStartError as e:
                fail(str(e))
            progress.advance(task)
            if not ev.ok:
                failures += 1
                rows.append({"problem": p.id, "error": f"{ev.status}: {ev.message}"})
                continue
            gpu_name, sw = ev.device.get("name", "?"), software_tag(ev.device)
            for name, st in ev.timings.items():
                label = "torch" if name == "candidate" else name
                store.add_baseline(p.id, p.source, gpu_name, sw, label, vars(st), ev.correctness.get(label) or {})
                rows.append({"problem": p.id, "baseline": label, "median_ms": st.median_ms, "p20_ms": st.p20_ms,
                             "p80_ms": st.p80_ms, "n": st.n, "method": st.method, "gpu": gpu_name})
    if as_json:
        emit_json(rows)
    else:
        t = Table(title=f"baselines: {loaded.name} -> {results}")
        for col in ("problem", "baseline", "median ms", "p20", "p80", "n", "method"):
            t.add_column(col)
        for r in rows:
            if "error" in r:
                t.add_row(r["problem"], "[red]error[/]", r["error"][:80], "", "", "", "")
            else:
                t.add_row(r["problem"], r["baseline"], f"{r['median_ms']:.4f}", f"{r['p20_ms']:.4f}",
                          f"{r['p80_ms']:.4f}", str(r["n"]), r["method"])
        console.print(t)
    raise typer.Exit(EXIT_FAILURES if failures else 0)


def _open_store(path: Path) -> Any:
    from cuforge.results.store import Store, StoreError

    try:
        return Store(path, create=False)
    except StoreError as e:
        fail(str(e))


@app.command()
def leaderboard(
    run: Optional[str] = typer.Option(None, "--run", "-r", help="Run id (default: the latest run)."),
    suite: Optional[str] = typer.Option(None, "--suite", "-s", help="Only problems of this suite."),
    baseline: str = typer.Option("torch", help="cublas, cublaslt, torch or torch.compile."),
    results: Path = typer.Option(Path("results/cuforge.db"), help="SQLite results store."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Best correct speedup per problem, correct rate, fast_0/1/1.5/2 and geomean; hgemm per shape."""
    from cuforge.problems.problem import BASELINES, ProblemError
    from cuforge.results.leaderboard import build_leaderboard
    from cuforge.results.store import StoreError

    if baseline not in BASELINES:
        fail(f"unknown baseline {baseline!r}; choose from {', '.join(BASELINES)}")
    store = _open_store(results)
    try:
        row = store.run(run) if run else store.latest_run()
    except StoreError as e:
        fail(str(e))
    only = None
    if suite:
        from cuforge.problems.suites import load_suite

        try:
            only = {p.id for p in load_suite(suite).problems}
        except ProblemError as e:
            fail(str(e))
    board = build_leaderboard(store.evaluations(row.id), store.run_problems(row.id), row.id, baseline, only)
    if as_json:
        emit_json(board.to_dict())
        return
    t = Table(title=f"run {row.id} ({row.status}, {row.gpu or '?'}) - speedup vs {baseline}")
    for col in ("problem", "best speedup", "best ms", "correct", "evaluations", "failures"):
        t.add_column(col)
    for r in board.rows:
        t.add_row(r.problem_id, f"{r.best_speedup:.3f}x" if r.best_speedup else "-",
                  f"{r.best_median_ms:.4f}" if r.best_median_ms else "-", f"{100 * r.correct_rate:.0f}%",
                  str(r.evaluations), ", ".join(f"{k} {v}" for k, v in sorted(r.failures.items())))
    console.print(t)
    fast = "  ".join(f"{k} {100 * v:.0f}%" for k, v in board.fast.items())
    gm = f"{board.geomean_speedup:.3f}x" if board.geomean_speedup else "-"
    console.print(f"{len(board.problems)} problems  {fast}  geomean of best {gm}")
    if board.hgemm:
        h = Table(title="hgemm per shape: measured here vs CUDA-L2 (reported, their method: host wall clock, no L2 flush)")
        for col in ("M", "N", "K", "vs cuBLAS", "vs cuBLASLt-autotune", "CUDA-L2 vs cuBLAS", "CUDA-L2 vs cuBLASLt-AT"):
            h.add_column(col)
        fmt = lambda x: f"{x:.3f}" if x else "-"  # noqa: E731
        for r in board.hgemm:
            h.add_row(str(r["M"]), str(r["N"]), str(r["K"]), fmt(r["measured_vs_cublas"]), fmt(r["measured_vs_cublaslt"]),
                      fmt(r["cuda_l2_reported_vs_cublas"]), fmt(r["cuda_l2_reported_vs_cublaslt"]))
        console.print(h)


@app.command()
def report(
    run: Optional[str] = typer.Argument(None, metavar="RUN", help="Run id (default: the latest run)."),
    out: Path = typer.Option(Path("report.html"), "--out", "-o", help="Output HTML file."),
    baseline: str = typer.Option("torch", help="Baseline for speedups."),
    results: Path = typer.Option(Path("results/cuforge.db"), help="SQLite results store."),
) -> None:
    """Write one self-contained offline HTML report of a run (tables and SVG charts, no CDN)."""
    from cuforge.results.leaderboard import build_leaderboard
    from cuforge.results.report import render_report
    from cuforge.results.store import StoreError

    store = _open_store(results)
    try:
        row = store.run(run) if run else store.latest_run()
    except StoreError as e:
        fail(str(e))
    evaluations = store.evaluations(row.id)
    board = build_leaderboard(evaluations, store.run_problems(row.id), row.id, baseline)
    text = render_report(row, board, evaluations, store.run_problem_metas(row.id), store.llm_usage(row.id))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    console.print(f"wrote {out} ({len(text) // 1024} KiB, {len(evaluations)} evaluations)")


@results_app.command("list")
def results_list(
    results: Path = typer.Option(Path("results/cuforge.db"), help="SQLite results store."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Runs in the store, newest first."""
    store = _open_store(results)
    runs = store.runs()
    if as_json:
        emit_json([{"id": r.id, "status": r.status, "suite": r.suite, "gpu": r.gpu, "created_at": r.created_at} for r in runs])
        return
    t = Table(title=str(results))
    for col in ("run", "status", "suite", "gpu", "evaluations"):
        t.add_column(col)
    for r in runs:
        t.add_row(r.id, r.status, r.suite or "", r.gpu or "", str(len(store.evaluations(r.id))))
    console.print(t)


@results_app.command("export")
def results_export(
    run: str = typer.Argument(..., metavar="RUN", help="Run id."),
    fmt: str = typer.Option("csv", "--format", "-f", help="csv or parquet."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output file (default: RUN.FORMAT)."),
    results: Path = typer.Option(Path("results/cuforge.db"), help="SQLite results store."),
) -> None:
    """Every evaluation of a run, joined with its candidate, as CSV or Parquet."""
    from cuforge.results.dump import export_run
    from cuforge.results.store import StoreError

    store = _open_store(results)
    try:
        path = export_run(store, run, fmt, out or Path(f"{run}.{fmt}"))
    except StoreError as e:
        fail(str(e))
    console.print(f"wrote {path}")


if __name__ == "__main__":
    app()
