"""Where a traced value lives in memory when it is an input or parameter seen through views: the
leaf, and the shape and strides (in elements) the views give it. einsum, matmul of N-D tensors and
hand-written reshapes trace as unsqueeze / view / permute chains around one bmm; resolving them to
strides tells which are plain row-major operands, transposed ones, or merged leading dims."""

from __future__ import annotations

import math

from cuforge.kernels.leaves import leaf_spec
from cuforge.op_graph import OpNode, is_ref
from cuforge.problems.problem import Problem

VIEW_OPS = ("view", "reshape", "_unsafe_view", "unsqueeze", "squeeze", "permute")


def contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


def restride(shape: tuple[int, ...], strides: tuple[int, ...], new: tuple[int, ...]) -> tuple[int, ...] | None:
    """The strides of `new` as a view of memory laid out as (shape, strides), or None where no view
    can express it (the rule torch's view follows: each run of dims contiguous with one another may be
    split or merged; size-1 dims take any stride)."""
    if math.prod(shape) != math.prod(new):
        return None
    if not shape:
        return (1,) * len(new)
    out = [0] * len(new)
    view_d = len(new) - 1
    base = strides[-1]
    tensor_numel = view_numel = 1
    for d in reversed(range(len(shape))):
        tensor_numel *= shape[d]
        if d == 0 or (shape[d - 1] != 1 and strides[d - 1] != tensor_numel * base):
            while view_d >= 0 and (view_numel < tensor_numel or new[view_d] == 1):
                out[view_d] = view_numel * base
                view_numel *= new[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                base, tensor_numel, view_numel = strides[d - 1], 1, 1
    return tuple(out) if view_d == -1 else None


def is_dense(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Row-major contiguous, ignoring the strides of size-1 dims."""
    return all(s == c for s, c, d in zip(strides, contiguous(shape), shape) if d != 1)


def swapped(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The layout with its last two dims swapped (what a ".T" reference reads)."""
    if len(shape) < 2:
        return None
    return shape[:-2] + (shape[-1], shape[-2]), strides[:-2] + (strides[-1], strides[-2])


def apply_view(node: OpNode, shape: tuple[int, ...], strides: tuple[int, ...], swap: bool
               ) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(shape, strides) after `node` (a view op) of a value laid out so; `swap`: its operand is read
    with the last two dims swapped (a ".T" reference)."""
    if swap:
        found = swapped(shape, strides)
        if found is None:
            return None
        shape, strides = found
    if node.op == "permute":
        dims = node.args[1] if len(node.args) > 1 else None
        if not isinstance(dims, (tuple, list)) or sorted(d % len(shape) for d in dims) != list(range(len(shape))):
            return None
        return tuple(shape[d] for d in dims), tuple(strides[d] for d in dims)
    new = restride(shape, strides, tuple(node.shape))
    return None if new is None else (tuple(node.shape), new)


def layout(problem: Problem, ref: str) -> tuple[str, tuple[int, ...], tuple[int, ...]] | None:
    """ref as (leaf, shape, strides) when it is an input or parameter seen through views, permutes
    and ".T" (the last two dims swapped); None when some op in between computes something."""
    base = ref[:-2] if ref.endswith(".T") else ref
    spec = leaf_spec(problem, base)
    if spec is not None:
        leaf, found = base, (tuple(spec.shape), contiguous(tuple(spec.shape)))
    else:
        node: OpNode | None = next((n for n in problem.graph if n.out == base), None)
        if node is None or node.op not in VIEW_OPS or not node.args or not is_ref(node.args[0]):
            return None
        inner = layout(problem, node.args[0])
        if inner is None:
            return None
        leaf, found = inner[0], apply_view(node, inner[1], inner[2], False)
    if found is not None and ref.endswith(".T"):
        found = swapped(*found)
    return None if found is None else (leaf, *found)
