"""Max and average pooling over 1-3 spatial dims of an NC... fp32 tensor (kernel, stride, padding,
dilation, count_include_pad from the trace; 1-d pooling is traced as 2-d over an unsqueezed dim):
one thread per output element, the window unrolled at compile time, NaN propagating through max as
in PyTorch. Every case is handled as 3-d with unit leading dims."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cuforge.kernels.base import GraphFamily
from cuforge.problems.problem import Problem
from cuforge.sandbox.candidate import LaunchSpec

POOLS = {"max_pool2d_with_indices": ("max", 2), "max_pool3d_with_indices": ("max", 3), "max_pool2d": ("max", 2),
         "max_pool3d": ("max", 3), "avg_pool2d": ("avg", 2), "avg_pool3d": ("avg", 3)}


@dataclass(frozen=True)
class PoolMatch:
    kind: str  # max | avg
    planes: int  # N * C
    size: tuple[int, int, int]  # input D, H, W
    out: tuple[int, int, int]
    kernel: tuple[int, int, int]
    stride: tuple[int, int, int]
    padding: tuple[int, int, int]
    dilation: tuple[int, int, int]
    count_pad: bool


def _triple(v: Any, nd: int, default: int | None = None) -> tuple[int, ...] | None:
    if v is None or v == () or v == []:
        return None if default is None else (default,) * nd
    vals = tuple(v) if isinstance(v, (list, tuple)) else (v,)
    if len(vals) == 1:
        vals = vals * nd
    if len(vals) != nd or not all(isinstance(x, int) and not isinstance(x, bool) for x in vals):
        return None
    return vals


def match_pool(problem: Problem) -> PoolMatch | str:
    g = problem.graph
    if len(problem.inputs) != 1 or problem.inputs[0].dtype != "float32":
        return "needs one fp32 input"
    node = next((n for n in g if n.op in POOLS), None)
    if node is None:
        return "no max or average pooling"
    kind, nd = POOLS[node.op]
    shape = tuple(problem.inputs[0].shape)
    src, squeezed = node.args[0], False
    rest = [n for n in g if n is not node]
    if src != "in0":  # 1-d pooling: unsqueeze(x, -2) -> 2-d pool -> squeeze(-2)
        pre = next((n for n in g if n.out == src), None)
        if pre is None or pre.op != "unsqueeze" or pre.args[0] != "in0" or pre.args[1] not in (-2, len(shape) - 1):
            return "the pooled tensor is not the input (or the input unsqueezed for 1-d pooling)"
        shape = tuple(pre.shape)
        rest = [n for n in rest if n is not pre]
        squeezed = True
    if len(shape) != nd + 2:
        return f"a {nd}-d pooling of a {len(shape) - 2}-d input"
    a = list(node.args) + [None] * 8
    kernel = _triple(a[1], nd)
    stride = _triple(a[2], nd) or kernel
    padding = _triple(a[3], nd, 0)
    if kind == "max":
        dilation, ceil, count_pad, divisor = _triple(a[4], nd, 1), a[5] or False, True, None
    else:
        dilation, ceil = (1,) * nd, a[4] or False
        count_pad = True if a[5] is None else a[5]
        divisor = a[6]
    if kernel is None or stride is None or padding is None or dilation is None:
        return "pooling sizes that are not constants"
    if ceil or divisor is not None:
        return "ceil_mode or divisor_override"
    if any(p * 2 > k for p, k in zip(padding, kernel)):
        return "padding larger than half the kernel"
    size = shape[2:]
    out = tuple((s + 2 * p - d * (k - 1) - 1) // st + 1 for s, p, d, k, st in zip(size, padding, dilation, kernel, stride))
    want = (shape[0], shape[1]) + out
    outs = problem.outputs
    if len(outs) != 1 or outs[0].dtype != "float32" or math.prod(outs[0].shape) != math.prod(want) or min(out) <= 0:
        return "the output is not the pooled values"
    for n in rest:  # only the squeeze of the values (and an unused one of the indices) may remain
        if n.op != "squeeze" or not (n.args[0] == node.out or n.args[0] == f"{node.out}.0" or
                                     (n.args[0] == f"{node.out}.1" and n.out not in problem.graph_outputs)):
            return f"{n.op} beside the pooling"
    if squeezed:
        values = next((n.out for n in rest if n.args[0] in (node.out, f"{node.out}.0")), None)
        expected: tuple[tuple[str, ...], ...] = ((values,),)
    else:
        expected = ((node.out,), (f"{node.out}.0",))
    if problem.graph_outputs not in expected:
        return "the forward's output is not the pooled values"
    def as_3d(t: tuple[int, ...], fill: int) -> tuple[int, int, int]:  # leading unit dims
        return (fill,) * (3 - nd) + tuple(t)  # type: ignore[return-value]

    return PoolMatch(kind, shape[0] * shape[1], as_3d(size, 1), as_3d(out, 1), as_3d(kernel, 1), as_3d(stride, 1),
                     as_3d(padding, 0), as_3d(dilation, 1), bool(count_pad))


class Pool(GraphFamily):
    """One thread per output element (consecutive threads along the output's last dim)."""

    def __init__(self) -> None:
        super().__init__("pool", {"BLOCK": (128, 256, 512, 1024)})

    def match(self, problem: Problem) -> PoolMatch | str:
        return match_pool(problem)

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        return [dict(BLOCK=256), dict(BLOCK=512), dict(BLOCK=128)]

    def extra(self, problem: Problem) -> dict[str, Any]:
        m = self.matched(problem)
        return {"KIND": m.kind, "P": m}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        m = self.matched(problem)
        total = m.planes * math.prod(m.out)
        return LaunchSpec(entry=self.name, grid=f"(cdiv(total, {c['BLOCK']}),)", block=f"({c['BLOCK']},)",
                          args=("in0", "out0", "total"), outputs=((repr(tuple(problem.outputs[0].shape)), "float32"),),
                          bindings=(("total", str(total)),))
