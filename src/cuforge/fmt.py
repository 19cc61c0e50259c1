"""Number formatting shared by the CLI and the prompts."""

from __future__ import annotations


def si(x: float | None, unit: str = "") -> str:
    """1.5e9 -> '1.5G'; None -> '?'."""
    if x is None:
        return "?"
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{suffix}{unit}"
    return f"{x:.3g}{unit}"
