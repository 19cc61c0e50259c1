"""Reductions over one dim (or a run of adjacent dims) that is not the last: sum, mean, max, min,
argmax, argmin of an fp32 tensor seen as (outer, R, inner). Threads run across `inner`, so every
load of a warp is one contiguous stretch; the last-dim case is reduce_rows'."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cuforge.kernels.base import GraphFamily
from cuforge.op_graph import constant_dims, is_ref
from cuforge.problems.problem import Problem
from cuforge.sandbox.candidate import LaunchSpec

REDUCTIONS = ("sum", "mean", "max", "min", "amax", "amin", "argmax", "argmin")


@dataclass(frozen=True)
class DimReduction:
    op: str  # sum | mean | max | min | argmax | argmin
    outer: int
    reduced: int
    inner: int


def match_dim_reduction(problem: Problem) -> DimReduction | str:
    """The forward as one reduction over adjacent non-last dims of its fp32 input, or why it is not."""
    g = problem.graph
    if len(g) != 1 or g[0].op not in REDUCTIONS:
        return f"not a single {', '.join(REDUCTIONS)} over a dim"
    node = g[0]
    if len(problem.inputs) != 1 or problem.inputs[0].dtype != "float32" or node.args[0] != "in0":
        return "needs the reduction of one fp32 input"
    if problem.graph_outputs not in ((node.out,), (f"{node.out}.0",)):
        return "the forward's output is not the reduction's value"
    if node.kwarg("dtype") is not None:
        return "a reduction with a dtype= conversion"
    shape = tuple(problem.inputs[0].shape)
    dim_arg = node.args[1] if len(node.args) > 1 else node.kwarg("dim")
    dims = constant_dims(dim_arg, len(shape)) if dim_arg is not None and not is_ref(dim_arg) else None
    if dims is None:
        return "no constant dim (a full reduction)"
    if dims != tuple(range(dims[0], dims[-1] + 1)):
        return "reduced dims are not adjacent"
    outer, reduced, inner = (math.prod(shape[: dims[0]]), math.prod(shape[dims[0]: dims[-1] + 1]),
                             math.prod(shape[dims[-1] + 1:]))
    if inner < 8:
        return "over the last dim (or nearly): reduce_rows' case"
    op = {"amax": "max", "amin": "min"}.get(node.op, node.op)
    want = "int64" if op in ("argmax", "argmin") else "float32"
    out = problem.outputs[0] if len(problem.outputs) == 1 else None
    if out is None or out.dtype != want or math.prod(out.shape) != outer * inner:
        return f"needs one {want} output of {outer * inner} elements"
    if reduced == 0 or reduced >= 2**31 or outer * inner >= 2**40:
        return "empty or enormous"
    return DimReduction(op, outer, reduced, inner)


class ReduceDim(GraphFamily):
    """TX threads across the inner dim, TY down the reduced one, each keeping CHAINS partials (sums in
    double, max/min/arg with NaN and first-index-on-ties as torch), then a shared-memory combine."""

    def __init__(self) -> None:
        super().__init__("reduce_dim", {"TX": (32, 64, 128, 256), "TY": (1, 2, 4, 8, 16, 32), "UNROLL": (1, 4, 8),
                                        "CHAINS": (1, 2, 4)})

    DEFAULTS = {"CHAINS": 1}  # configs from before the knob

    def match(self, problem: Problem) -> DimReduction | str:
        return match_dim_reduction(problem)

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        return 64 <= c["TX"] * c["TY"] <= 1024

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        m = self.matched(problem)
        # Few output columns: spread the reduced dim over more threads.
        ty = 16 if m.outer * m.inner < 64 * 1024 else 8
        # Big blocks first where the inner dim fills them: on (128, 4096, 4095) over dim 1 (H100), 128 x 8
        # threads with 4 loads each ran 3% faster than 64 x 8 (kb_s22_rd_probe), which ran 4% faster than
        # 64 x 4 and 12% faster than 8 loads a thread in flight (kb_s22_probe1).
        wide = [dict(TX=128, TY=8, UNROLL=4, CHAINS=1)] if m.inner >= 128 else []
        return wide + [dict(TX=64, TY=ty, UNROLL=4, CHAINS=1), dict(TX=128, TY=4, UNROLL=4, CHAINS=1), dict(TX=64, TY=4, UNROLL=2, CHAINS=2),
                       dict(TX=32, TY=ty, UNROLL=4, CHAINS=1), dict(TX=32, TY=ty, UNROLL=1, CHAINS=4), dict(TX=128, TY=2, UNROLL=8, CHAINS=1)]

    def extra(self, problem: Problem) -> dict[str, Any]:
        m = self.matched(problem)
        return {"OP": m.op, "OUT_T": "long long" if m.op.startswith("arg") else "float"}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        m = self.matched(problem)
        out = problem.outputs[0]
        return LaunchSpec(entry=self.name, grid=f"(outer * cdiv(inner, {c['TX']}),)", block=f"({c['TX']}, {c['TY']})",
                          args=("in0", "out0", "reduced", "inner"),
                          outputs=((repr(tuple(out.shape)), out.dtype),),
                          bindings=(("outer", str(m.outer)), ("reduced", str(m.reduced)), ("inner", str(m.inner))))
