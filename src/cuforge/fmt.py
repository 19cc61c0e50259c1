"""Words and numbers shared by the CLI, the prompts and the file guards."""

from __future__ import annotations

import stat


def si(x: float | None, unit: str = "") -> str:
    """1.5e9 -> '1.5G'; None -> '?'."""
    if x is None:
        return "?"
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{suffix}{unit}"
    return f"{x:.3g}{unit}"


def file_kind(mode: int) -> str:
    """What a stat mode that is not a regular file names: 'a FIFO', 'a character device', ..."""
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"
