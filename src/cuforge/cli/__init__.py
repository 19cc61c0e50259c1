"""The `cuforge` command line: thin commands that parse, call one module below, and print."""

from cuforge.cli import doctor_cmd, eval_cmd, export_cmd, problems_cmd, results_cmd, run_cmd  # noqa: F401 - registers commands
from cuforge.cli.app import app, main

__all__ = ["app", "main"]
