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
