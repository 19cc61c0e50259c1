"""The traced op graph's vocabulary, free of torch so the CLI process can hold it (see op_trace)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

_REF = re.compile(r"^(in|param|t|c)\d+(x|\.\d+)?(\.T)?$")


def is_ref(x: Any) -> bool:
    """Whether an argument is a tensor ref (not a constant)."""
    return isinstance(x, str) and bool(_REF.match(x))


@dataclass(frozen=True)
class OpNode:
    """One dispatched op. Tensor arguments are refs: "in0" (forward's first input), "param1" (the
    model's parameters then buffers, in Problem.params order), "t3" (node 3's result; "t3.1" its
    second), "c3" (a tensor the forward made from nothing); a ".T" suffix is the same tensor with its
    last two dims swapped (a view, no copy). Other arguments are kept as JSON-friendly constants."""

    op: str
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...]
    out: str
    shape: tuple[int, ...]

    def to_json(self) -> list[Any]:
        return [self.op, list(self.args), [list(kv) for kv in self.kwargs], self.out, list(self.shape)]

    @staticmethod
    def from_json(d: list[Any]) -> OpNode:
        op, args, kwargs, out, shape = d
        return OpNode(op, tuple(_tuplify(a) for a in args), tuple((k, _tuplify(v)) for k, v in kwargs), out,
                      tuple(shape))

    def kwarg(self, name: str, default: Any = None) -> Any:
        return dict(self.kwargs).get(name, default)


def constant_dims(arg: Any, ndim: int) -> tuple[int, ...] | None:
    """The dims a traced dim argument names (an int or a list of ints, negative ones counted from the
    end), sorted and non-negative; None when it is not constant ints within `ndim`."""
    dims = arg if isinstance(arg, (list, tuple)) else (arg,)
    if not dims or not all(isinstance(d, int) and not isinstance(d, bool) and -ndim <= d < ndim for d in dims):
        return None
    return tuple(sorted({d % ndim for d in dims}))


def is_last_dim(arg: Any, ndim: int) -> bool:
    """Whether a traced dim argument names exactly the last dim."""
    return ndim > 0 and constant_dims(arg, ndim) == (ndim - 1,)


def _tuplify(x: Any) -> Any:
    return tuple(_tuplify(v) for v in x) if isinstance(x, list) else x


# Reductions that give back their input when every dim they reduce has size 1 and is kept: the sum,
# mean, max or logsumexp of one element is that element.
_SIZE1_IDENTITIES = frozenset({"sum", "mean", "amax", "amin", "max", "min", "logsumexp", "prod", "nansum", "nanmean"})
_BASE = re.compile(r"^((?:in|param|t|c)\d+)(.*)$")


def rename_refs(x: Any, alias: dict[str, str]) -> Any:
    """`x` (an op's argument, or a tuple of them) with each ref whose base name `alias` maps renamed,
    its result index (".0") kept."""
    if isinstance(x, tuple):
        return tuple(rename_refs(v, alias) for v in x)
    if is_ref(x):
        base, dot, rest = x.partition(".")
        if base in alias:
            return alias[base] + dot + rest
    return x


def renamed_node(n: OpNode, alias: dict[str, str], op: str | None = None) -> OpNode:
    """The node with its arguments' refs renamed (rename_refs), and its op replaced where `op` is given."""
    return OpNode(op or n.op, rename_refs(n.args, alias), tuple((k, rename_refs(v, alias)) for k, v in n.kwargs), n.out, n.shape)


def _renamed(x: Any, alias: dict[str, str]) -> Any:
    if isinstance(x, tuple):
        return tuple(_renamed(v, alias) for v in x)
    if is_ref(x):
        m = _BASE.match(x)
        if m and m.group(1) in alias:
            return (alias[m.group(1)] + m.group(2)).replace(".T.T", "")  # swapped twice: as stored
    return x


def drop_identity_reductions(nodes: tuple[OpNode, ...], outputs: tuple[str, ...]) -> tuple[tuple[OpNode, ...], tuple[str, ...]]:
    """The graph without reductions over kept size-1 dims (identities), their uses renamed to their
    input, so that matching sees through them (a row sum then max / mean / logsumexp over the summed
    dim is a row sum). A reduction whose other results (max's indices) are used stays."""
    shapes = {n.out: n.shape for n in nodes}
    used = {m.group(0) for n in nodes for m in re.finditer(r"\b[tc]\d+\.\d+", repr(n.args) + repr(n.kwargs))}
    used |= set(outputs)
    alias: dict[str, str] = {}
    kept: list[OpNode] = []
    for n in nodes:
        n = OpNode(n.op, _renamed(n.args, alias), tuple((k, _renamed(v, alias)) for k, v in n.kwargs), n.out, n.shape)
        src = n.args[0] if n.args else None
        if (n.op in _SIZE1_IDENTITIES and isinstance(src, str) and src in shapes and shapes[src] == n.shape
                and len(n.args) >= 2 and n.kwarg("dtype") is None and not any(u.startswith(n.out + ".") for u in used)):
            alias[n.out] = src
            continue
        kept.append(n)
    return tuple(kept), tuple(_renamed(o, alias) for o in outputs)


_PRODUCTS = frozenset({"mm", "bmm"})
_OPERAND_VIEWS = frozenset({"view", "reshape", "_unsafe_view", "unsqueeze", "squeeze", "permute"})
_INDEX = re.compile(r"^[tc](\d+)")


def scalar_factor(node: OpNode, division: bool = False) -> tuple[str, float] | None:
    """(tensor ref, number) when the node multiplies one tensor by a Python number, or (`division`)
    divides one by a nonzero number (the factor is then its reciprocal)."""
    if node.op not in ("mul", "div") or (node.op == "div" and not division) or len(node.args) != 2 or node.kwargs:
        return None
    pairs = (node.args,) if node.op == "div" else (node.args, node.args[::-1])
    for x, s in pairs:
        if is_ref(x) and isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s):
            if node.op == "mul":
                return x, float(s)
            return (x, 1.0 / float(s)) if s != 0 else None
    return None


def fold_operand_scales(nodes: tuple[OpNode, ...], outputs: tuple[str, ...]) -> tuple[tuple[OpNode, ...], tuple[str, ...]]:
    """The graph with each number that scales a matmul operand (q * s, k * s before q @ k^T: how
    scaled_dot_product_attention's math traces) moved after the product, past the views of its result:
    (a * s) @ (b * t) = (a @ b) * (s * t), so that a GEMM reads its operands as stored and scales in its
    epilogue. Only scales whose result feeds nothing else are moved."""
    uses: dict[str, int] = {}
    for n in nodes:
        for m in re.finditer(r"\b[tc]\d+", repr(n.args) + repr(n.kwargs)):
            uses[m.group(0)] = uses.get(m.group(0), 0) + 1
    for o in outputs:
        uses[o.split(".")[0]] = uses.get(o.split(".")[0], 0) + 1
    by_out = {n.out: n for n in nodes}
    dropped: dict[str, str] = {}  # a moved scale's result -> the tensor it scaled
    factor: dict[str, float] = {}  # product -> the numbers moved onto it
    for p in nodes:
        if p.op not in _PRODUCTS:
            continue
        for ref in p.args[:2]:
            while is_ref(ref) and ref.split(".")[0] in by_out and uses.get(ref.split(".")[0]) == 1:
                n = by_out[ref.split(".")[0]]
                scaled = scalar_factor(n)
                if scaled is not None:
                    dropped[n.out] = scaled[0]
                    factor[p.out] = factor.get(p.out, 1.0) * scaled[1]
                    break
                if n.op not in _OPERAND_VIEWS or not n.args:
                    break
                ref = n.args[0]
    if not factor:
        return nodes, outputs
    # Where each product's scale goes: after the views its result alone passes through.
    consumers: dict[str, OpNode] = {}
    for n in nodes:
        if n.args and is_ref(n.args[0]):
            consumers.setdefault(n.args[0], n)
    after: dict[str, float] = {}
    for p, f in factor.items():
        end = p
        while uses.get(end) == 1 and end in consumers and consumers[end].op in _OPERAND_VIEWS:
            end = consumers[end].out
        after[end] = after.get(end, 1.0) * f
    fresh = 1 + max(int(m.group(1)) for n in nodes if (m := _INDEX.match(n.out)))
    alias: dict[str, str] = {}
    kept: list[OpNode] = []
    for n in nodes:
        if n.out in dropped:
            alias[n.out] = _renamed(dropped[n.out], alias)
            continue
        n = OpNode(n.op, _renamed(n.args, alias), tuple((k, _renamed(v, alias)) for k, v in n.kwargs), n.out, n.shape)
        kept.append(n)
        if n.out in after and after[n.out] != 1.0:
            scaled = OpNode("mul", (n.out, after[n.out]), (), f"t{fresh}", n.shape)
            fresh += 1
            kept.append(scaled)
            alias[n.out] = scaled.out
    return tuple(kept), tuple(_renamed(o, alias) for o in outputs)
