"""Verdicts the judge reaches on a candidate's outputs, each naming the cheat it catches: an output
that aliases an input, or one that repeats the last call's result when the reference's changed.
What is watched around the call itself (patched functions, threads, kernels and their streams) is in
host/monitor.py, which runs beside the candidate. Verdicts are (kind, message) pairs; kinds are
CHEAT_KINDS.
"""

from __future__ import annotations

from typing import Any

import torch

from cuforge.sandbox.protocol.tensors import same_bits

Verdict = tuple[str, str]  # (cheat kind, message)


def span(t: torch.Tensor) -> tuple[int, int]:
    st = t.untyped_storage()
    return st.data_ptr(), st.data_ptr() + st.nbytes()


def overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1] and a[1] > a[0] and b[1] > b[0]


def alias_violation(
    outputs: list[torch.Tensor],
    inputs: list[Any],
    live_references: list[torch.Tensor],
    reference_aliases_input: bool,
) -> Verdict | None:
    """Output memory shared with an input, or with a reference result allocated after the candidate
    returned (its output did not own its memory, so the reference wrote into it)."""
    for i, o in enumerate(outputs):
        out_span = span(o)
        if not reference_aliases_input:
            for j, x in enumerate(inputs):
                if isinstance(x, torch.Tensor) and overlaps(out_span, span(x)):
                    return ("aliasing", f"output {i} shares memory with input {j}")
        for r in live_references:
            if overlaps(out_span, span(r)):
                return ("aliasing", f"output {i} shares memory with a reference result")
    return None


def caching_violation(out: torch.Tensor, previous_out: torch.Tensor | None, refs_differ: bool) -> Verdict | None:
    """The same bits for different inputs: the candidate returned a remembered result."""
    if previous_out is None or not refs_differ or out.shape != previous_out.shape:
        return None
    if same_bits(out, previous_out):
        return ("result_caching", "returned the identical result for different inputs")
    return None


