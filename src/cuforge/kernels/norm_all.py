"""x / ||x|| over the whole tensor (a Frobenius normalization: torch.norm(x, p='fro') or
linalg_vector_norm with no dims). The norm needs every element before any output, so two kernels of
one source: a preparing kernel writes one double-precision partial sum of squares per block, then
the main kernel's blocks each sum those partials in the same order (so all see the same norm) and
write x / norm in a grid-stride pass."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cuforge.kernels.base import GraphFamily, sm_count
from cuforge.problems.problem import Problem
from cuforge.sandbox.candidate import LaunchSpec

PARTS_PER_SM = 4  # partial sums: enough blocks to stream the input at full bandwidth, few to sum


@dataclass(frozen=True)
class NormAllMatch:
    numel: int


def _whole_l2_norm(node: Any) -> bool:
    if node.op != "linalg_vector_norm" or node.args[0] != "in0" or node.shape != () or node.kwarg("dtype") is not None:
        return False
    ord_, dims, keepdim = (list(node.args[1:]) + [2, None, False])[:3]
    ord_ = node.kwarg("ord", ord_)
    dims = node.kwarg("dim", dims)
    return ord_ in (2, 2.0) and dims in (None, ()) and not node.kwarg("keepdim", keepdim)


def match_norm_all(problem: Problem) -> NormAllMatch | str:
    if len(problem.inputs) != 1 or problem.inputs[0].dtype != "float32":
        return "needs one fp32 input"
    g = problem.graph
    if len(g) != 2 or not _whole_l2_norm(g[0]) or g[1].op != "div" or g[1].args[:2] != ("in0", g[0].out):
        return "not x / (the L2 norm of all of x)"
    if problem.graph_outputs != (g[1].out,):
        return "returns other than x / ||x||"
    return NormAllMatch(math.prod(problem.inputs[0].shape))


class NormAll(GraphFamily):
    """BLOCK threads a block, VEC-wide loads (VEC 4 when the element count allows 16-byte vectors)."""

    def __init__(self) -> None:
        super().__init__("norm_all", {"BLOCK": (256, 512, 1024), "VEC": (1, 4), "WAVES": (1, 2, 4)})

    def match(self, problem: Problem) -> NormAllMatch | str:
        return match_norm_all(problem)

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        return c["VEC"] == 1 or self.matched(problem).numel % 4 == 0

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        vec = 4 if self.matched(problem).numel % 4 == 0 else 1
        return [dict(BLOCK=512, VEC=vec, WAVES=2), dict(BLOCK=256, VEC=vec, WAVES=4), dict(BLOCK=1024, VEC=vec, WAVES=1)]

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        grid = f"(max(1, min(cdiv(N, {c['BLOCK'] * c['VEC']}), SMS * {c['WAVES'] * 2048 // c['BLOCK']})),)"
        return LaunchSpec(entry=self.name, grid=grid, block=f"({c['BLOCK']},)", args=("in0", "out0", "scratch0", "PARTS", "N"),
                          outputs=(("in0.shape", "float32"),), bindings=(sm_count("in0"), ("N", "in0.numel()"),
                                                                          ("PARTS", f"max(1, min(cdiv(N, {c['BLOCK']}), SMS * {PARTS_PER_SM}))")),
                          scratch=(("(PARTS,)", "float64", "empty"),),
                          pre=((f"{self.name}_sumsq", "(PARTS,)", f"({c['BLOCK']},)", "(in0, scratch0, N)"),))
