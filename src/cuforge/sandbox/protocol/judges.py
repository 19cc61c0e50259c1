"""Which judge evaluates a candidate: in the worker's own process, or split (the candidate in a
candidate host). The driver chooses and tells the worker; the worker reads the same choice."""

from __future__ import annotations

import os


JUDGES = ("inprocess", "split")


def requested_judge() -> str:
    """CUFORGE_JUDGE as the user set it, normalised (`inprocess` where unset); not yet checked."""
    return os.environ.get("CUFORGE_JUDGE", "").strip().lower() or "inprocess"


def checked_judge(mode: str) -> str:
    """`mode` if it names a judge; else one line naming the valid ones."""
    if mode not in JUDGES:
        raise ValueError(f"CUFORGE_JUDGE={mode!r}: use {' or '.join(JUDGES)}")
    return mode


def judge_mode() -> str:
    """Where candidates run: `inprocess` (the default: in the worker, watched by host/monitor.py) or
    `split` (each in its own confined process; see judge/in_host.py and host/host.py)."""
    return checked_judge(requested_judge())


def judge_for(untrusted: bool) -> str:
    """The judge for a run's or an eval's candidates: CUFORGE_JUDGE where the user set it; otherwise
    `split` for code cuforge did not write (an LLM's, a replayed run's, a file's), where the
    evaluation rate is the proposer's, and `inprocess` for the template search's own kernels, where
    it is the GPU's (split ~90 per GPU-minute against ~190 in-process on an H100, hgemm 1024^3)."""
    if os.environ.get("CUFORGE_JUDGE", "").strip():
        return judge_mode()
    return "split" if untrusted else "inprocess"
