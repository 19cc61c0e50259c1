"""What a kernel's chain reads besides its own value: the forward's inputs and parameters (leaves), the
views of them that only add or drop size-1 dims, the index of an operand broadcast to the output
(per row, per column, per channel, or any numpy broadcast), and the refs a node reads."""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from cuforge.op_graph import OpNode, is_ref
from cuforge.problems.problem import Problem, TensorSpec


def leaf_spec(problem: Problem, ref: str) -> TensorSpec | None:
    """The spec of an input or parameter ref (None for anything else, transposed views included)."""
    for prefix, specs in (("in", problem.inputs), ("param", problem.params)):
        if ref.startswith(prefix) and ref[len(prefix):].isdigit():
            i = int(ref[len(prefix):])
            return specs[i] if i < len(specs) else None
    return None


def broadcast_kind(shape: tuple[int, ...], full: tuple[int, ...]) -> str | None:
    """"rc", "c", "r" or "s" (a single value) for a shape that broadcasts simply to `full`, else None."""
    if len(shape) <= len(full) and all(d == 1 for d in shape) and shape != full:
        return "s"
    if shape == full:
        return "rc"
    if shape in ((full[-1],), (1, full[-1])) and len(full) >= 1:
        return "c"
    if len(full) >= 2 and shape == full[:-1] + (1,):
        return "r"
    return None


def channel_kind(shape: tuple[int, ...], full: tuple[int, ...]) -> str | None:
    """For an NC... output (a convolution's): "rc", "s", or "ch" (one value per channel: (C, 1, 1),
    (1, C, 1, 1), ...) for a shape that broadcasts so to `full`, else None."""
    if all(d == 1 for d in shape) and len(shape) <= len(full) and shape != full:
        return "s"
    if shape == full:
        return "rc"
    per_channel = (full[1],) + (1,) * (len(full) - 2)
    trimmed = shape[next((i for i, d in enumerate(shape) if d != 1), len(shape)):]
    if len(shape) <= len(full) and len(full) >= 3 and trimmed and trimmed == per_channel[:len(trimmed)] \
            and shape[-(len(full) - 2):] == (1,) * (len(full) - 2):
        return "ch"
    return None


def broadcast_index(shape: tuple[int, ...], full: tuple[int, ...]) -> str | None:
    """The C index into an operand of `shape` that broadcasts to `full` (numpy's rules: dims aligned
    from the right, each 1 or full's) at the flat index r * cols + c of `full`, or None where it does
    not broadcast. The general case behind the per-row / per-column / per-channel kinds (a bias of
    shape (C, 1, 1, 1) after a pooling, say)."""
    if len(shape) > len(full):
        return None
    padded = (1,) * (len(full) - len(shape)) + tuple(shape)
    if any(d != 1 and d != f for d, f in zip(padded, full)):
        return None
    flat = "(r * (long long)cols + c)"
    lead = next((d for d, size in enumerate(padded) if size != 1), len(padded))
    if lead > 0 and tuple(padded[lead:]) == tuple(full[lead:]):  # full's trailing dims: one modulo
        return f"({flat} % {math.prod(full[lead:])}LL)"
    terms = []
    for d, (size, whole) in enumerate(zip(padded, full)):
        if size == 1:
            continue
        inner_full, inner_op = math.prod(full[d + 1:]), math.prod(padded[d + 1:])
        coord = flat if inner_full == 1 else f"({flat} / {inner_full}LL)"
        if d > 0:
            coord = f"({coord} % {whole}LL)"
        terms.append(coord if inner_op == 1 else f"{coord} * {inner_op}LL")
    return " + ".join(terms) or "0"


LEAF_VIEWS = ("unsqueeze", "squeeze", "view", "reshape", "_unsafe_view")


def leaf_views(problem: Problem, nodes: tuple[OpNode, ...]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Views of inputs and parameters that only add or drop size-1 dims (x.unsqueeze(1), w.view(1, -1, 1)):
    ref -> (the leaf, the view's shape). The leaf's memory order is the view's, so indexing it by the
    view's broadcast is indexing the leaf."""
    views: dict[str, tuple[str, tuple[int, ...]]] = {}
    for n in nodes:
        if n.op not in LEAF_VIEWS or not n.args or not is_ref(n.args[0]):
            continue
        leaf = views[n.args[0]][0] if n.args[0] in views else n.args[0]
        spec = leaf_spec(problem, leaf)
        if spec is not None and [d for d in n.shape if d != 1] == [d for d in spec.shape if d != 1]:
            views[n.out] = (leaf, tuple(n.shape))
    return views


def producer(problem: Problem, ref: str) -> OpNode | None:
    return next((n for n in problem.graph if n.out == ref), None)


def refs_in(node: OpNode) -> list[str]:
    """The tensor refs a node reads (in its args and kwargs, nested)."""
    out: list[str] = []

    def walk(x: Any) -> None:
        if isinstance(x, (tuple, list)):
            for v in x:
                walk(v)
        elif is_ref(x):
            out.append(x)

    walk(node.args)
    walk(tuple(v for _, v in node.kwargs))
    return out


def readers_of(problem: Problem) -> Mapping[str, frozenset[str]]:
    """Each ref the forward reads -> the results (outs) of the nodes that read it. The last graph's
    answer is kept: a partition's search asks it of one graph for hundreds of chains."""
    global _LAST_READERS
    graph, last = problem.graph, _LAST_READERS  # one read of the pair: another thread may replace it
    if last is not None and last[0] is graph:
        return last[1]
    readers: dict[str, set[str]] = {}
    for n in graph:
        for r in refs_in(n):
            readers.setdefault(r, set()).add(n.out)
    frozen: Mapping[str, frozenset[str]] = MappingProxyType({r: frozenset(o) for r, o in readers.items()})
    _LAST_READERS = (graph, frozen)
    return frozen


_LAST_READERS: tuple[tuple[OpNode, ...], Mapping[str, frozenset[str]]] | None = None  # the last graph asked
