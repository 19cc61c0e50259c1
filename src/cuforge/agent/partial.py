"""The part of a problem the template library covers when no family, staged pair or pipeline covers the
whole: a partition's candidate (kernels where families cover runs of ops, PyTorch written out for the
rest), or where none runs on the GPU, the longest head of the traced graph (a cut, as the staged
families cut) that one family's kernel computes. An LLM's prompt shows it, ready to run, and names the
ops no kernel covers, so the model writes kernels for those rather than for the whole operator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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


# The longest partition module a prompt shows (its kernels' sources are in it): past this, the prompt
# shows the longest covered head instead.
MAX_MODULE_CHARS = 40_000


def partition_cover(problem: Problem, family: Any) -> PartialCover | None:
    """The partition's own candidate (its first seed): kernels where families cover runs of ops, PyTorch
    written out for the rest; None where that module is too long to show."""
    parts = family.matched(problem)
    module = family.render(family.seeds(problem)[0], problem).source
    if len(module) > MAX_MODULE_CHARS:
        return None
    kernel_ops = tuple(n.op for q in parts if q.family is not None for n in q.nodes)
    torch_ops = tuple(dict.fromkeys(n.op for q in parts if q.family is None for n in q.nodes))
    out = problem.outputs[0] if problem.outputs else None
    return PartialCover(family="partition", module=module, head_ops=kernel_ops, rest_ops=torch_ops,
                        cut_shape=tuple(out.shape) if out else (), cut_dtype=out.dtype if out else "?", rest_inputs=())


def partial_cover(problem: Problem, compute_capability: str | None = None) -> PartialCover | None:
    """Where a partition covers the problem, its candidate (kernels for the runs of ops families cover,
    PyTorch for the rest); else the longest head of the graph one family covers, with its kernel (one
    that runs on a GPU of that compute capability, where it is known). None where the whole problem
    is covered (the offline search's), where no head is, or where the problem runs in another dtype
    than it was traced in (no family takes those yet)."""
    if problem.meta.cast or not problem.graph:
        return None
    covering = families_for(problem)[0]
    if covering and covering[0].name != "partition":  # a partition leaves parts to PyTorch: a kernel could do them
        return None
    if covering and (compute_capability is None or covering[0].runs_on(compute_capability)):
        whole = partition_cover(problem, covering[0])
        if whole is not None:
            return whole
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

