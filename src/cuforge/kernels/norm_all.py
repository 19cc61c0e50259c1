"""x / ||x|| over the whole tensor (a Frobenius normalization: torch.norm(x, p='fro') or
linalg_vector_norm with no dims). The norm needs every element before any output, so two kernels of
one source: a preparing kernel writes one double-precision partial sum of squares per block, and its
last block to finish sums them in a fixed order into the norm; the main kernel writes x / norm, a
block per BLOCK x UNROLL vectors (knob ONCE) or in a grid-stride pass."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from cuforge.kernels.base import GraphFamily, grid_stride_grid, sm_count
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec
from cuforge.kernels.registry import family

# Partial sums (blocks of the grid-stride sum of squares) an SM: level1/37 on the H100, 2.47 ms at 4, 2.45 at 32
# (torch.compile's 2.42); 32 x 132 partials are summed by one block in a few microseconds.
PARTS_PER_SM = 32


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


@family(200)
class NormAll(GraphFamily):
    """BLOCK threads a block, VEC-wide loads (VEC 4 when the element count allows 16-byte vectors), UNROLL
    loads in flight a thread in both passes (1: one at a time, configs from before the knob). ONCE: the
    main pass a block per BLOCK x UNROLL vectors (WAVES unused); 0: a grid-stride pass on WAVES blocks an
    SM's worth of threads (the only form before the knob)."""

    def __init__(self) -> None:
        super().__init__("norm_all", {"BLOCK": (256, 512, 1024), "VEC": (1, 4), "WAVES": (1, 2, 4), "UNROLL": (1, 2, 4, 8),
                                      "ONCE": (0, 1)})

    DEFAULTS: ClassVar[dict[str, Any]] = {"UNROLL": 1, "ONCE": 0}

    def match(self, problem: Problem) -> NormAllMatch | str:
        return match_norm_all(problem)

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        if c.get("ONCE", 0) and c["WAVES"] != 1:
            return False  # one grid whatever WAVES says: a single spelling
        return c["VEC"] == 1 or self.matched(problem).numel % 4 == 0

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        vec = 4 if self.matched(problem).numel % 4 == 0 else 1
        # level1/37 on the H100 (the main pass alone): a block per 512 vectors 4.93 ms, the copy of the same
        # tensor 4.96, the grid-stride pass 5.29 at 2 waves of 512 threads (UNROLL 1-8 within 1% of it).
        return [dict(BLOCK=512, VEC=vec, WAVES=1, UNROLL=1, ONCE=1), dict(BLOCK=256, VEC=vec, WAVES=1, UNROLL=2, ONCE=1),
                dict(BLOCK=512, VEC=vec, WAVES=2, UNROLL=1, ONCE=0)]

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        # ONCE: a block per BLOCK x UNROLL vectors (waves 0); else at most WAVES full GPUs of blocks
        once = c.get("ONCE", 0)
        grid = grid_stride_grid(f"cdiv(N, {c['VEC'] * (c.get('UNROLL', 1) if once else 1)})", c["BLOCK"], 0 if once else c["WAVES"])
        return LaunchSpec(entry=self.name, grid=grid, block=f"({c['BLOCK']},)", args=("in0", "out0", "scratch2", "N"),
                          outputs=(("in0.shape", "float32"),), bindings=(sm_count("in0"), ("N", "in0.numel()"),
                                                                          ("PARTS", f"max(1, min(cdiv(N, {c['BLOCK']}), SMS * {PARTS_PER_SM}))")),
                          # the partial sums, the count of blocks done with theirs (zero every call), the norm
                          scratch=(("(PARTS,)", "float64", "empty"), ("(1,)", "int32", "zeros"), ("(1,)", "float32", "empty")),
                          pre=((f"{self.name}_sumsq", "(PARTS,)", f"({c['BLOCK']},)", "(in0, scratch0, scratch1, scratch2, N)"),))
