"""Which judge evaluates a candidate: in the worker's own process, or split (the candidate in a
candidate host). The driver chooses and tells the worker; the worker reads the same choice."""

from __future__ import annotations

import os


JUDGES = ("inprocess", "split")


def judge_mode() -> str:
    """Where candidates run: `inprocess` (the default: in this worker, guarded by cheats.py) or
    `split` (each in its own confined process; see judge.py and host.py)."""
    mode = os.environ.get("CUFORGE_JUDGE", "inprocess").strip().lower() or "inprocess"
    if mode not in JUDGES:
        raise ValueError(f"CUFORGE_JUDGE={mode!r}: use inprocess or split")
    return mode


def judge_for(untrusted: bool) -> str:
    """The judge for a run's or an eval's candidates: CUFORGE_JUDGE where the user set it; otherwise
    `split` for code cuforge did not write (an LLM's, a replayed run's, a file's), where the
    evaluation rate is the proposer's, and `inprocess` for the template search's own kernels, where
    it is the GPU's (split ~110 per GPU-minute against ~237 in-process on an H100)."""
    if os.environ.get("CUFORGE_JUDGE", "").strip():
        return judge_mode()
    return "split" if untrusted else "inprocess"
