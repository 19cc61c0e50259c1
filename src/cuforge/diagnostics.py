"""A compiler's message about a candidate, as NVRTC, nvcc or Python report it: what the runtime raises
and what the evaluation records carry back to proposers."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Diagnostic:
    """One compiler message, for feedback to proposers."""

    line: int | None
    column: int | None
    severity: str  # "error" | "warning"
    message: str

    def __str__(self) -> str:
        where = f"line {self.line}" + (f":{self.column}" if self.column else "") if self.line else "?"
        return f"{where}: {self.severity}: {self.message}"
