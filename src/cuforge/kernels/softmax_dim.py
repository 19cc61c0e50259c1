"""Softmax and log-softmax over a dim that is not the last (over the channels of an NC... tensor, as a
convolution's output is normalized), with the traced elementwise ops after it fused into the write. The
tensor is seen as (outer, R, inner) with the softmax over R: threads run across `inner`, so each load
of a warp is one contiguous stretch, and each thread walks its own column of R values twice - an
online (max, sum of exp) pass, then the output pass, whose reads come back from cache."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cuforge.kernels.base import GraphFamily
from cuforge.kernels.chains import Epilogue, compile_chain
from cuforge.op_graph import constant_dims
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec
from cuforge.kernels.registry import family

SOFTMAX_OPS = {"_softmax": False, "_log_softmax": True}  # op -> log (the last-dim ones trace as *_lastdim)


@dataclass(frozen=True)
class DimSoftmax:
    log: bool
    outer: int
    reduced: int
    inner: int
    chain: Epilogue
    cols: int  # the last dim: where the chain's per-row / per-column operands change


def match_dim_softmax(problem: Problem) -> DimSoftmax | str:
    """The forward as a softmax over a middle dim of its fp32 input, then elementwise ops, or why not."""
    g = problem.graph
    if not g or g[0].op not in SOFTMAX_OPS:
        return "not a softmax or log-softmax over a dim other than the last"
    node = g[0]
    if not problem.inputs or problem.inputs[0].dtype != "float32" or node.args[0] != "in0":
        return "needs the softmax of an fp32 input"
    if len(node.args) > 2 and node.args[2] is True:
        return "softmax with an output dtype change (half_to_float)"
    shape = tuple(problem.inputs[0].shape)
    dims = constant_dims(node.args[1], len(shape)) if len(node.args) > 1 else None
    if dims is None or len(dims) != 1:
        return "no constant dim"
    d = dims[0]
    outer, reduced, inner = math.prod(shape[:d]), shape[d], math.prod(shape[d + 1:])
    if inner < 8:
        return "over the last dim (or nearly): the row families' case"
    if reduced == 0 or reduced >= 2**31 or outer * reduced * inner >= 2**40:
        return "empty or enormous"
    # Operands broadcast any way (a (C, 1, 1) bias over the channels) are read at their flat index.
    chain = compile_chain(problem, g[1:], node.out, shape, allow_rowsum=False)
    if isinstance(chain, str):
        return f"after the softmax: {chain}"
    out = problem.outputs[0] if len(problem.outputs) == 1 else None
    if out is None or out.dtype != "float32" or tuple(out.shape) != shape:
        return "needs one fp32 output of the input's shape"
    return DimSoftmax(SOFTMAX_OPS[node.op], outer, reduced, inner, chain, shape[-1])


@family(170)
class SoftmaxDim(GraphFamily):
    """TX threads a block across the inner dim, one column of R values a thread, UNROLL loads in flight."""

    def __init__(self) -> None:
        super().__init__("softmax_dim", {"TX": (64, 128, 256), "UNROLL": (1, 4, 8)})

    def match(self, problem: Problem) -> DimSoftmax | str:
        return match_dim_softmax(problem)

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        return [dict(TX=128, UNROLL=4), dict(TX=256, UNROLL=4), dict(TX=64, UNROLL=8)]

    def extra(self, problem: Problem) -> dict[str, Any]:
        m = self.matched(problem)
        return {"LOG": m.log, "EPI": m.chain, "INDEXED": m.chain.indexed}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        m = self.matched(problem)
        return LaunchSpec(entry=self.name, grid=f"(outer * cdiv(inner, {c['TX']}),)", block=f"({c['TX']},)",
                          args=("in0", "out0", "reduced", "inner", "cols", *m.chain.launch_args()),
                          outputs=(("in0.shape", "float32"),),
                          bindings=(("outer", str(m.outer)), ("reduced", str(m.reduced)), ("inner", str(m.inner)), ("cols", str(m.cols))))
