"""`cuforge leaderboard`, `cuforge report`, `cuforge results list|export`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table

from cuforge.cli.app import app, console, emit_json, err_console, fail, store_path, show_table
from cuforge.cli.app import results_app


def _open_store(path: Path) -> Any:
    """Read-only commands open the store read-only: nothing in it is changed, converted or migrated."""
    from cuforge.results.store import Store, StoreError

    try:
        return Store(store_path(path), readonly=True)
    except StoreError as e:
        fail(str(e))


def _check_baseline(baseline: str) -> None:
    from cuforge.problems.problem import BASELINES
    from cuforge.sandbox.protocol.precision import OTHER_FLAGS_BASELINES

    known = (*BASELINES, *OTHER_FLAGS_BASELINES)
    if baseline not in known:
        fail(f"--baseline: unknown baseline {baseline!r}; choose from {', '.join(known)}")


@app.command()
def leaderboard(
    run: Optional[str] = typer.Option(None, "--run", "-r", help="Run id (default: the latest run)."),
    suite: Optional[str] = typer.Option(None, "--suite", "-s", help="Only problems of this suite."),
    baseline: str = typer.Option("torch", help="torch (eager under the run's precision contract), torch.strict (eager, "
                                 "TF32 off), torch.default_flags (eager, PyTorch's default flags), torch.compile (and .strict, "
                                 ".default_flags where the flags change what it runs), "
                                 "cublas or cublaslt."),
    results: Path = typer.Option(Path("results/cuforge.db"), help="SQLite results store (a file or a directory)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Best correct speedup per problem, correct rate, fast_0/1/1.5/2 and geomean; hgemm per shape."""
    from cuforge.problems.problem import ProblemError
    from cuforge.results.leaderboard import baseline_words, build_leaderboard
    from cuforge.results.store import StoreError

    _check_baseline(baseline)
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
    words = baseline_words(baseline, row.config.get("precision"))
    if as_json:
        emit_json({**board.to_dict(), "precision": row.config.get("precision") or "per problem (fp32 unless declared)",
                   "baseline_means": words})
        return
    t = Table(title=f"run {row.id} ({row.status}, {row.gpu or '?'}) - speedup vs {baseline}: {words}")
    for col in ("problem", "best speedup", "best ms", "correct", "evaluations", "failures"):
        t.add_column(col)
    for r in board.rows:
        t.add_row(r.problem_id, f"{r.best_speedup:.3f}x" if r.best_speedup else "-",
                  f"{r.best_median_ms:.4f}" if r.best_median_ms else "-", f"{100 * r.correct_rate:.0f}%",
                  str(r.evaluations), ", ".join(f"{k} {v}" for k, v in sorted(r.failures.items())))
    show_table(t)
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
        show_table(h)
        tg = board.hgemm_targets
        console.print(f"hgemm geomean vs cuBLAS {fmt(tg['geomean_vs_cublas'])} over {tg['with_result']}/{tg['shapes']} "
                      f"shapes with a result (M*N*K <= 2^30: {fmt(tg['geomean_vs_cublas_small'])}, >= 2^36: "
                      f"{fmt(tg['geomean_vs_cublas_large'])}); vs cuBLASLt-autotune {fmt(tg['geomean_vs_cublaslt'])}",
                      highlight=False)


@app.command()
def report(
    run: Optional[str] = typer.Argument(None, metavar="RUN", help="Run id (default: the latest run)."),
    out: Path = typer.Option(Path("report.html"), "--out", "-o", help="Output HTML file (not replaced without --force; "
                             "- for standard output)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing output file (never a results store)."),
    baseline: str = typer.Option("torch", help="Baseline for speedups."),
    results: Path = typer.Option(Path("results/cuforge.db"), help="SQLite results store (a file or a directory)."),
) -> None:
    """Write one self-contained offline HTML report of a run (tables and SVG charts, no CDN)."""
    from cuforge.outputs import OutputError, check_output_file, write_file
    from cuforge.results.leaderboard import build_leaderboard
    from cuforge.results.report import render_report
    from cuforge.results.store import StoreError

    _check_baseline(baseline)
    try:
        check_output_file(out, force, (store_path(results),))
    except OutputError as e:
        fail(f"--out: {e}")
    store = _open_store(results)
    try:
        row = store.run(run) if run else store.latest_run()
    except StoreError as e:
        fail(str(e))
    evaluations = store.evaluations(row.id)
    board = build_leaderboard(evaluations, store.run_problems(row.id), row.id, baseline)
    text = render_report(row, board, evaluations, store.run_problem_metas(row.id), store.llm_usage(row.id),
                         store.run_skipped(row.id))
    try:
        write_file(out, text)
    except OutputError as e:
        fail(str(e))
    err_console.print(f"wrote {out} ({len(text) // 1024} KiB, {len(evaluations)} evaluations)", highlight=False)


@results_app.command("list")
def results_list(
    results: Path = typer.Option(Path("results/cuforge.db"), help="SQLite results store (a file or a directory)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Runs in the store, newest first."""
    store = _open_store(results)
    runs = store.runs()
    if as_json:
        emit_json([{"id": r.id, "status": r.status, "suite": r.suite, "gpu": r.gpu, "created_at": r.created_at} for r in runs])
        return
    t = Table(title=str(store_path(results)))
    for col in ("run", "status", "suite", "gpu", "evaluations"):
        t.add_column(col)
    for r in runs:
        t.add_row(r.id, r.status, r.suite or "", r.gpu or "", str(len(store.evaluations(r.id))))
    show_table(t)


@results_app.command("export")
def results_export(
    run: str = typer.Argument(..., metavar="RUN", help="Run id."),
    fmt: str = typer.Option("csv", "--format", "-f", help="csv or parquet."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output file (default: RUN.FORMAT; not replaced "
                                       "without --force; - for standard output)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing output file (never a results store)."),
    results: Path = typer.Option(Path("results/cuforge.db"), help="SQLite results store (a file or a directory)."),
) -> None:
    """Every evaluation of a run, joined with its candidate, as CSV or Parquet."""
    from cuforge.outputs import OutputError, check_output_file, write_file
    from cuforge.results.dump import FORMATS, render_run
    from cuforge.results.store import StoreError

    if fmt not in FORMATS:
        fail(f"--format: unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    target = out or Path(f"{run}.{fmt}")
    try:
        check_output_file(target, force, (store_path(results),))
    except OutputError as e:
        fail(f"--out: {e}")
    store = _open_store(results)
    try:
        data = render_run(store, run, fmt)
        write_file(target, data)
    except (StoreError, OutputError) as e:
        fail(str(e))
    err_console.print(f"wrote {target}", highlight=False)
