"""The typer app and what every command shares: consoles, exit codes, one-line errors, JSON."""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

import typer
from rich.console import Console

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


@app.callback(invoke_without_command=True)
def main(version: bool = typer.Option(False, "--version", help="Print the version and exit.")) -> None:
    if version:
        console.print(f"cuforge {__version__}")
        raise typer.Exit(0)
