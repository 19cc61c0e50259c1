"""`cuforge doctor`."""

from __future__ import annotations

import typer
from rich.table import Table

from cuforge.cli.app import app, console, emit_json, show_table


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
    show_table(table)
    for g in report.gpus:
        console.print(f"GPU {g['index']}: {g['name']}, {g['sm_count']} SMs, sm_{g['compute_capability'].replace('.', '')}, "
                      f"{g['memory_gib']} GiB, L2 {g['l2_mib']} MiB")
    console.print("ready for GPU runs" if report.ready_for_gpu_runs else
                  "[yellow]not ready for GPU runs[/] (CPU-only work: tests, problems, --compile-only)")
