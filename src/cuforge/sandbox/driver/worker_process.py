"""What the driver reads of a worker's process from outside it: its resident memory, how it ended."""

from __future__ import annotations

import signal


def rss_bytes(pid: int) -> int:
    """Resident memory of a process and its descendants."""
    total = 0
    stack = [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        break
            with open(f"/proc/{p}/task/{p}/children") as f:
                stack += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue
    return total


def describe_exit(code: int | None, jailed: bool = False) -> str:
    """How a worker's process ended, in words (bubblewrap's 128 + signal read as that signal)."""
    if code is None:
        return "still running"
    if jailed and 128 < code < 128 + 65:
        code = 128 - code  # bubblewrap exits with 128 + the signal that killed the worker
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
