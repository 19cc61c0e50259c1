"""The part of a problem the template library covers when no family, staged pair or pipeline covers
the whole: the longest head of the traced graph (a cut, as the staged families cut) that one family's
kernel computes. An LLM's prompt shows that kernel, ready to run, and names the ops left, so the model
writes a kernel for the rest rather than for the whole operator."""

from __future__ import annotations

from dataclasses import dataclass

from cuforge.kernels.base import PY_CONFIG_TAG, as_stage
from cuforge.kernels.families import FAMILIES, families_for
from cuforge.kernels.staged import Staged, cuts_of, head_covers
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import wrap_stages

@dataclass(frozen=True)
class PartialCover:
    """One family's kernel for the head of a problem's graph; the ops after it are left to write."""

    family: str
    module: str  # a module whose ModelNew runs the family's kernel and returns the head's output
    head_ops: tuple[str, ...]
    rest_ops: tuple[str, ...]
    cut_shape: tuple[int, ...]
    cut_dtype: str
    rest_inputs: tuple[int, ...]  # the forward's inputs the rest reads besides the head's output


def partial_cover(problem: Problem, compute_capability: str | None = None) -> PartialCover | None:
    """The longest head of the graph one family covers (with a kernel that runs on a GPU of that compute
    capability, where it is known), with its kernel; None where the whole problem is covered (the
    offline search's), where no head is, or where the problem runs in another dtype than it was
    traced in (no family takes those yet)."""
    if problem.meta.cast or not problem.graph:
        return None
    covering = families_for(problem)[0]
    if covering and covering[0].name != "partition":  # a partition leaves parts to PyTorch: a kernel could do them
        return None
    singles = [f for f in FAMILIES if not isinstance(f, Staged)
               and (compute_capability is None or f.runs_on(compute_capability))]
    for cut in cuts_of(problem):  # the longest head first: the most already done
        for fam in singles:
            if not head_covers(fam, cut.head):
                continue
            seed = next((s for s in fam.seeds(cut.head) if fam.valid(s, cut.head)), None)
            if seed is None:
                continue
            cand = fam.render(seed, cut.head)
            header = PY_CONFIG_TAG + f'{{"family": "{fam.name}", "part": "head"}}\n'
            out = cut.head.outputs[0] if cut.head.outputs else None
            return PartialCover(
                family=fam.name, module=wrap_stages([as_stage(cand)], [None], header),
                head_ops=cut.head.ops, rest_ops=cut.tail.ops,  # the computed ops, views left out
                cut_shape=tuple(out.shape) if out else (), cut_dtype=out.dtype if out else "?",
                rest_inputs=cut.tail_inputs)
    return None

