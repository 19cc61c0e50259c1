"""What the template kernels assume of a problem's tensors, checked before any family is asked: each
kernel reads its inputs in row-major order and launches over a non-empty output."""

from __future__ import annotations

from cuforge.problems.problem import Problem


def unusual_tensors(problem: Problem) -> str:
    """Why no family's kernel takes the problem's tensors as they are, or "": an input that is not
    row-major in memory (every kernel reads its inputs so), or a dim of size zero (nothing to launch)."""
    for i, t in enumerate(problem.inputs):
        if not t.is_scalar and not t.contiguous:
            return (f"input {i} ({t.describe()}) is a transposed or expanded view: the template kernels read "
                    "their inputs in row-major order")
    for kind, specs in (("input", problem.inputs), ("output", problem.outputs or ())):
        for i, t in enumerate(specs):
            if not t.is_scalar and 0 in t.shape:
                return f"{kind} {i} ({t.describe()}) has a dim of size zero: there is nothing to launch a kernel for"
    return ""
