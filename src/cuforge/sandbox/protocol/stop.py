"""How an evaluation ends early: a status, a message, and whether the process that ran the
candidate can still be trusted. Shared by the judge and the candidate host."""

from __future__ import annotations

from typing import Any

# Messages of CUDA errors that leave the context unusable: that process must be replaced.
STICKY_CUDA_ERRORS = ("illegal memory access", "misaligned address", "unspecified launch failure",
                      "illegal instruction", "an illegal", "launch timed out", "hardware stack error",
                      "device-side assert", "uncorrectable ECC", "CUDA error: unknown error")


class Stop(Exception):
    """Ends an evaluation early with a status and message; `restart` asks for a fresh process."""

    def __init__(self, status: str, message: str, restart: bool = False, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.message, self.restart, self.extra = status, message, restart, extra


def is_sticky(e: BaseException) -> bool:
    text = str(e)
    return any(s in text for s in STICKY_CUDA_ERRORS)
