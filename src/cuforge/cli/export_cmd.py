"""`cuforge export`: a run's winning kernels as a pip-installable torch package or a CMake C library."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from cuforge.cli.app import app, console, emit_json, err_console, fail, store_path, show_table


@app.command()
def export(
    run: Optional[str] = typer.Argument(None, help="Run id (default: the latest run)."),
    fmt: str = typer.Option("torch", "--format", "-f", help="torch (pip package of custom ops) or cmake (C library)."),
    to: Path = typer.Option(..., "--to", "-o", help="Output directory: new, empty, or an earlier export's (whose files "
                            "it replaces); nothing else in it is touched."),
    name: Optional[str] = typer.Option(None, help="Package / library name (default cuforge_kernels / cuforge)."),
    arch: str = typer.Option("sm_90a,sm_80", help="Archs to prebuild, comma-separated."),
    min_speedup: float = typer.Option(1.0, help="Use a kernel only where it beat torch and cuBLAS by this factor."),
    jobs: int = typer.Option(2, min=1, max=64, help="Parallel nvcc builds."),
    results: Path = typer.Option(Path("results/cuforge.db"), help="SQLite results store (a file or a directory)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable summary."),
) -> None:
    """Export the best kernel per tuned shape, with the reference as fallback everywhere else."""
    from cuforge.export import FORMATS, export_run
    from cuforge.export.plan import ExportError

    if fmt not in FORMATS:
        fail(f"--format: unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    if not min_speedup > 0 or min_speedup > 1000:
        fail(f"--min-speedup: {min_speedup:g} is out of range; it must be more than 0 and at most 1000")
    results = store_path(results)
    try:
        with err_console.status(f"exporting {run or 'the latest run'} as {fmt} (nvcc builds each kernel)..."):
            result = export_run(results, run, fmt, to, name, arch, min_speedup, jobs)
    except ExportError as e:
        fail(str(e))
    if as_json:
        emit_json(result.summary())
        return
    t = Table(title=f"{result.name} ({fmt}) from run {result.plan.run['run_id']} -> {to}")
    for col in ("op", "tuned shapes", "left to fallback", "best speedup vs fallback"):
        t.add_column(col)
    for op in result.plan.ops:
        best = max((min(v for k, v in e.speedups.items() if k in ("torch", "cublas")) for e in op.entries), default=None)
        t.add_row(op.name, str(len(op.entries)), str(len(op.skipped)), f"{best:.3f}x" if best else "-")
    show_table(t)
    nxt = f"pip install {to}" if fmt == "torch" else f"cmake -S {to} -B {to}/build && cmake --build {to}/build"
    console.print(f"{len(result.files)} files written. Next: {nxt}", highlight=False)
