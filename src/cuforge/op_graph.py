"""The traced op graph's vocabulary, free of torch so the CLI process can hold it (see op_trace)."""

from __future__ import annotations

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


def _renamed(x: Any, alias: dict[str, str]) -> Any:
    if isinstance(x, tuple):
        return tuple(_renamed(v, alias) for v in x)
    if is_ref(x):
        m = _BASE.match(x)
        if m and m.group(1) in alias:
            return alias[m.group(1)] + m.group(2)
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
