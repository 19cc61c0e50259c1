"""Last-dim concatenations a chain reads in place instead of making them: LLaMA's rotate_half
(cat(-x[..., h:], x[..., :h]), pieces of slices side by side) and interleaved pairs (stack((a, b),
-1) viewed back as the last dim, as the GPT-J/NeoX-style rotary embedding writes it: column c of the
output is piece c % 2 at column c // 2). Which nodes make such a value, found here; the chain compiler
turns them into one expression per output element."""

from __future__ import annotations

from dataclasses import dataclass

from cuforge.kernels.leaves import LEAF_VIEWS, leaf_spec, readers_of
from cuforge.op_graph import OpNode, is_ref
from cuforge.problems.problem import Problem


@dataclass(frozen=True)
class Rotation:
    """A last-dim concatenation of pieces, each an elementwise function of a slice of an input along its
    last dim (LLaMA's rotate_half: cat(-x[..., h:], x[..., :h])): computed per element by reading the
    input at the column the piece takes it from, so the sliced and concatenated copies are never made."""

    pieces: tuple[tuple[str, int], ...]  # (the piece's value, its width), in order
    nodes: frozenset[str]  # the values computed only for the pieces (slices and what follows them)


def last_dim_slice(problem: Problem, node: OpNode, full: tuple[int, ...]) -> tuple[str, int, int] | None:
    """(input, first column, width) for x[..., a:b] of an input shaped as the chain's output."""
    x, dim, start, end = (tuple(node.args) + (None,) * 4)[:4]
    step = node.args[4] if len(node.args) > 4 else 1
    spec = leaf_spec(problem, x) if is_ref(x) else None
    if spec is None or tuple(spec.shape) != full or step != 1 or not all(isinstance(v, int) for v in (dim, start, end)):
        return None
    if dim % len(full) != len(full) - 1:
        return None
    n = full[-1]
    lo, hi = (min(n, max(0, v + n if v < 0 else v)) for v in (start, end))
    return (x, lo, hi - lo) if hi > lo else None


def rotations(problem: Problem, nodes: tuple[OpNode, ...], full: tuple[int, ...],
              unary: tuple[str, ...], binary: tuple[str, ...]) -> dict[str, Rotation]:
    """The chain's last-dim concatenations whose pieces are elementwise functions (one-operand ops and
    ops with a constant) of last-dim slices of inputs, each piece's values read by nothing else."""
    made = {n.out: n for n in nodes}
    if not any(n.op == "cat" for n in nodes):
        return {}  # readers_of walks the whole graph: a partition's search asks this of thousands of chains
    readers = readers_of(problem)
    found: dict[str, Rotation] = {}
    for cat in nodes:
        if cat.op != "cat" or not cat.args or not isinstance(cat.args[0], tuple) or tuple(cat.shape) != full:
            continue
        dim = cat.args[1] if len(cat.args) > 1 else cat.kwarg("dim", 0)
        if not isinstance(dim, int) or dim % len(full) != len(full) - 1:
            continue
        inner: set[str] = set()
        pieces: list[tuple[str, int]] = []

        def walk(ref: str) -> int | None:
            """The piece's width, collecting the values it is made of; None if it is not one."""
            node = made.get(ref)
            if node is None:
                return None
            inner.add(ref)
            if node.op == "slice":
                s = last_dim_slice(problem, node, full)
                return None if s is None else s[2]
            refs = [a for a in node.args if is_ref(a)]
            if len(refs) != 1 or node.op not in unary + binary or len(node.args) > 2 and node.op not in unary:
                return None
            return walk(refs[0])

        for piece in cat.args[0]:
            width = walk(piece) if is_ref(piece) else None
            if width is None:
                break
            pieces.append((piece, width))
        else:
            if sum(w for _, w in pieces) == full[-1] and all(readers.get(r, set()) <= inner | {cat.out} for r in inner):
                found[cat.out] = Rotation(tuple(pieces), frozenset(inner))
    return found


@dataclass(frozen=True)
class Interleave:
    """out[..., P * j + p] = pieces[p][..., j]: P values of the `half` grid stacked along a new last dim
    and viewed back as one last dim. Each piece is an elementwise function of step-P slices of inputs
    shaped as the output, inputs that broadcast to the half grid (a rotary table) and constants."""

    pieces: tuple[str, ...]
    half: tuple[int, ...]  # the pieces' shape: the output's with its last dim divided by P
    nodes: frozenset[str]  # the values computed only for the pieces (slices, ops, the stack)


def strided_slice(problem: Problem, node: OpNode, full: tuple[int, ...], step: int) -> tuple[str, int] | None:
    """(input, first column) for x[..., a::step] of an input shaped as the output, a < step."""
    x, dim, start, end = (tuple(node.args) + (None,) * 4)[:4]
    spec = leaf_spec(problem, x) if is_ref(x) else None
    if spec is None or tuple(spec.shape) != full or len(node.args) < 5 or node.args[4] != step:
        return None
    if not isinstance(dim, int) or dim % len(full) != len(full) - 1 or not isinstance(start, int) \
            or not 0 <= start < step or not isinstance(end, int) or end < full[-1]:
        return None
    return x, start


def interleavings(problem: Problem, nodes: tuple[OpNode, ...], full: tuple[int, ...],
                  unary: tuple[str, ...], binary: tuple[str, ...]) -> dict[str, Interleave]:
    """The chain's views of a last-dim stack back to the output's shape whose pieces are elementwise
    functions of step-P slices, broadcast inputs and constants, each value read by nothing else."""
    made = {n.out: n for n in nodes}
    if not any(n.op == "stack" for n in nodes):
        return {}  # as in rotations: no stack, no interleaving, and no walk over the whole graph
    readers = readers_of(problem)
    found: dict[str, Interleave] = {}
    for view in nodes:
        src = made.get(view.args[0]) if view.op in LEAF_VIEWS and view.args and is_ref(view.args[0]) else None
        if src is None or src.op != "stack" or tuple(view.shape) != full or not isinstance(src.args[0], tuple):
            continue
        dim = src.args[1] if len(src.args) > 1 else src.kwarg("dim", 0)
        step, half = len(src.args[0]), tuple(src.shape[:-1])
        if not isinstance(dim, int) or dim % len(src.shape) != len(src.shape) - 1 or step < 2 \
                or half[:-1] != full[:-1] or half[-1] * step != full[-1]:
            continue
        inner: set[str] = {src.out}

        def walk(ref: str) -> bool:
            """Whether the value is a piece's: collecting the nodes it is made of."""
            node = made.get(ref)
            if node is None:  # a leaf read where the piece is computed
                spec = leaf_spec(problem, ref)
                return spec is not None and len(spec.shape) <= len(half)
            if node.op in LEAF_VIEWS and node.args and is_ref(node.args[0]) and node.args[0] not in made:
                # A view of a leaf that only adds or drops size-1 dims (cos.unsqueeze(0)): read as the leaf.
                spec = leaf_spec(problem, node.args[0])
                return spec is not None and len(node.shape) <= len(half) \
                    and [d for d in node.shape if d != 1] == [d for d in spec.shape if d != 1]
            inner.add(ref)
            if node.op == "slice":
                return strided_slice(problem, node, full, step) is not None
            if node.op not in unary + binary or tuple(node.shape) != half:
                return False
            args = node.args[:1] if node.op in unary else node.args[:2]
            return all(walk(a) if is_ref(a) else isinstance(a, (int, float)) for a in args) \
                and all(not is_ref(a) for a in node.args[len(args):])

        if all(is_ref(p) and walk(p) for p in src.args[0]) \
                and all(readers.get(r, set()) <= inner | {view.out} for r in inner):
            found[view.out] = Interleave(tuple(src.args[0]), half, frozenset(inner))
    return found
