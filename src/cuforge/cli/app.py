"""The typer app and what every command shares: consoles, exit codes, one-line errors, JSON."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

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

# Piped or redirected output is never wrapped at rich's default 80 columns: long ids and lines stay whole.
console = Console(soft_wrap=not sys.stdout.isatty())
err_console = Console(stderr=True, soft_wrap=not sys.stderr.isatty())


def _cell(value: Any) -> str:
    text = value.plain if hasattr(value, "plain") else str(value)
    return " ".join(text.split())  # one row a line: a cell's own line breaks become spaces


def show_table(table: Any, to: Console | None = None) -> None:
    """A rich table on a terminal; otherwise plain tab-separated rows with every cell whole (the
    title, then the header unless the table hides it), which scripts and pagers read as they are."""
    out = to or console
    if out.is_terminal:
        out.print(table)
        return
    columns = list(table.columns)
    lines = [_cell(table.title)] if table.title else []
    if table.show_header:
        lines.append("\t".join(_cell(c.header) for c in columns))
    for row in zip(*(list(c.cells) for c in columns)):
        lines.append("\t".join(_cell(v) for v in row))
    out.file.write("\n".join(lines) + "\n")
    out.file.flush()

# Exit codes: 0 success, 1 the command ran and found failures, 2 bad input or environment.
EXIT_FAILURES = 1
EXIT_BAD_INPUT = 2


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@contextmanager
def inspecting(suite: str) -> Iterator[Any]:
    """A callback for each problem file a suite's loading inspects in a subprocess (each import
    bounded by the inspection timeout; files answered from the cache are not announced): the file's
    name in a status line on a terminal, a line each on stderr otherwise."""
    if not err_console.is_terminal:
        def line(path: Path) -> None:
            sys.stderr.write(f"inspecting {path} ...\n")
            sys.stderr.flush()
        yield line
        return
    with err_console.status(f"loading {escape(suite)} ...", spinner="dots") as status:
        yield lambda path: status.update(f"loading {escape(suite)}: inspecting {escape(path.name)} ...")


def one_line(text: str, limit: int = 160) -> str:
    """The first line of a long reason, cut to fit a table cell or a progress line; the whole of it
    is in `problems show`, the store and the report."""
    first = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    more = len((text or "").strip().splitlines()) > 1 or len(first) > limit
    return (first[:limit - 1].rstrip() + " ...") if more else first


def store_path(results: Path) -> Path:
    """--results names the store file, or a directory holding cuforge.db (an existing one, or any
    path written with a trailing slash): the same in every command."""
    text = str(results)
    if results.is_dir() or text.endswith(("/", os.sep)):
        return results / "cuforge.db"
    return results


def describe_error(e: BaseException) -> str:
    """One line for an error no command caught: what failed and why, never a traceback."""
    if isinstance(e, UnicodeDecodeError):
        return f"a file is not UTF-8 text ({e.reason} at byte {e.start})"
    if isinstance(e, PermissionError):
        return f"{e.filename or 'a file'}: permission denied"
    if isinstance(e, FileNotFoundError):
        return f"{e.filename or 'a file'}: no such file or directory"
    if isinstance(e, IsADirectoryError):
        return f"{e.filename}: is a directory"
    if isinstance(e, OSError):
        return f"{e.filename + ': ' if e.filename else ''}{e.strerror or e}"
    if isinstance(e, sqlite3.Error):
        return f"results store: {e}"
    if isinstance(e, MemoryError):
        return "out of memory"
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def _click_exceptions() -> tuple[tuple[type, ...], tuple[type, ...], tuple[type, ...]]:
    """Click's usage errors, help-on-no-args and abort, from click itself and from the copy that
    newer typer releases carry inside them."""
    mods = []
    try:
        import click

        mods.append(click)
    except ImportError:  # pragma: no cover - typer without click
        pass
    try:
        from typer import _click

        mods.append(_click)
    except ImportError:
        pass

    def find(name: str) -> tuple[type, ...]:
        found = [getattr(m, name, None) or getattr(getattr(m, "exceptions", None), name, None) for m in mods]
        return tuple(c for c in found if isinstance(c, type))

    return find("ClickException"), find("NoArgsIsHelpError"), find("Abort")


def main() -> None:
    """The console entry point: one error boundary around every command. A bad option, a missing
    file or any other expected failure is one line on stderr with exit code 2; --debug (anywhere on
    the line) shows the traceback of an unexpected one."""
    click_exc, no_args_exc, abort_exc = _click_exceptions()
    argv = sys.argv[1:]
    debug = "--debug" in argv or bool(os.environ.get("CUFORGE_DEBUG"))
    argv = [a for a in argv if a != "--debug"]
    try:
        code = app(args=argv, prog_name="cuforge", standalone_mode=False)
    except no_args_exc as e:
        print(e.ctx.get_help() if e.ctx else "")
        code = EXIT_BAD_INPUT
    except click_exc as e:  # bad options and arguments
        where = f" (cuforge {e.ctx.command_path.split(' ', 1)[1]} --help)" if getattr(e, "ctx", None) and " " in e.ctx.command_path else ""
        err_console.print(f"[bold red]error:[/] {escape(' '.join(e.format_message().split()))}{where}",
                          highlight=False, soft_wrap=True)
        code = EXIT_BAD_INPUT
    except (KeyboardInterrupt, *abort_exc):
        err_console.print("[bold red]error:[/] interrupted", highlight=False)
        code = 130
    except Exception as e:  # noqa: BLE001 - the boundary
        if debug:
            raise
        err_console.print(f"[bold red]error:[/] {escape(describe_error(e))} (--debug shows the traceback)",
                          highlight=False, soft_wrap=True)
        code = EXIT_BAD_INPUT
    sys.exit(code if isinstance(code, int) else 0)


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


@app.callback(invoke_without_command=True)
def callback(version: bool = typer.Option(False, "--version", help="Print the version and exit."),
             debug: bool = typer.Option(False, "--debug", help="Show the traceback of an unexpected error.")) -> None:
    if version:
        console.print(f"cuforge {__version__}")
        raise typer.Exit(0)
