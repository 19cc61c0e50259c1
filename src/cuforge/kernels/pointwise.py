"""Pointwise chains: any forward made only of elementwise ops (activations written as one op or spelled
out with pow, tanh, exp, abs, div, ...) over fp32 tensors of the output's shape, with per-column or
per-row operands and constants, fused into one kernel that reads each input once and writes once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cuforge.kernels.base import GraphFamily, grid_stride_grid, sm_count
from cuforge.kernels.chains import ELEMENTWISE, LEAF_VIEWS, Epilogue, compile_chain
from cuforge.problems.problem import Problem
from cuforge.sandbox.candidate import LaunchSpec


@dataclass(frozen=True)
class PointwiseMatch:
    anchor: str  # the input read as the chain's starting value (vector loads)
    chain: Epilogue


def match_pointwise(problem: Problem) -> PointwiseMatch | str:
    """The forward as one pointwise chain, or why it is not one."""
    graph = problem.graph
    if not graph:
        return "no traced graph"
    odd = sorted({n.op for n in graph if n.op not in ELEMENTWISE + LEAF_VIEWS})
    if odd:
        return f"not only elementwise ops ({', '.join(odd)})"
    if len(problem.outputs) != 1 or problem.outputs[0].dtype != "float32":
        return "needs one fp32 output"
    full = tuple(problem.outputs[0].shape)
    if not full:
        return "a 0-dim output"
    anchor = next((f"in{i}" for i, x in enumerate(problem.inputs) if tuple(x.shape) == full and x.dtype == "float32"), None)
    if anchor is None:
        return "no fp32 input of the output's shape"
    chain = compile_chain(problem, graph, anchor, full, "float32", allow_rowsum=False)
    if isinstance(chain, str):
        return chain
    if not chain.body:
        return "the forward returns its input unchanged"
    return PointwiseMatch(anchor, chain)


class PointwiseChain(GraphFamily):
    """One thread per VEC consecutive elements (float4 loads and stores of the anchor), grid-stride
    loop; row and column are only computed when an operand is per-row or per-column."""

    def __init__(self) -> None:
        super().__init__("pointwise", {"VEC": (1, 2, 4), "BLOCK": (128, 256, 512, 1024), "WAVES": (1, 2, 4, 8, 16, 32, 0)})

    def match(self, problem: Problem) -> PointwiseMatch | str:
        return match_pointwise(problem)

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        return [dict(VEC=4, BLOCK=256, WAVES=0), dict(VEC=4, BLOCK=512, WAVES=8), dict(VEC=2, BLOCK=256, WAVES=0)]

    def extra(self, problem: Problem) -> dict[str, Any]:
        m = self.matched(problem)
        return {"EPI": m.chain, "INDEXED": m.chain.indexed, "OPS": " ".join(n.op for n in problem.graph)}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        m = self.matched(problem)
        grid = grid_stride_grid(f"cdiv(n, {c['VEC']})", c["BLOCK"], c["WAVES"])
        return LaunchSpec(entry=self.name, grid=grid, block=f"({c['BLOCK']},)",
                          args=(m.anchor, "out0", "n", "cols", *m.chain.launch_args()),
                          outputs=((f"{m.anchor}.shape", "float32"),),
                          bindings=(("n", f"{m.anchor}.numel()"), ("cols", f"{m.anchor}.shape[-1]"),
                                    sm_count(m.anchor)))
