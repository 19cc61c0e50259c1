"""Embedding bags (recommendation models' sparse features): each output row is the sum or mean of the
table's rows a bag of int64 indices names, bags given by int64 offsets into the indices (nn.EmbeddingBag
with 1-D input and offsets). fp32, fp16 or bf16 tables, summed in fp32, the output in the table's dtype.
Bound by gathering rows: a warp per bag reads each row with 16-byte loads, several rows in flight."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cuforge.kernels.base import GraphFamily
from cuforge.kernels.chains import CTYPES, per_16_bytes
from cuforge.kernels.leaves import leaf_spec
from cuforge.op_graph import is_ref
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec
from cuforge.kernels.registry import family

MODES = {0: "sum", 1: "mean"}  # _embedding_bag's mode argument (2, max, also returns indices: not here)


@dataclass(frozen=True)
class BagMatch:
    weight: str
    rows: int
    dim: int
    bags: int
    mean: bool
    dtype: str


def match_embedding_bag(problem: Problem) -> BagMatch | str:
    g = problem.graph
    if len(g) != 1 or g[0].op != "_embedding_bag":
        return "not one embedding bag"
    node = g[0]
    weight, indices, offsets, _, mode, _, per_sample, include_last, padding = (tuple(node.args) + (None,) * 9)[:9]
    if mode not in MODES:
        return f"an embedding bag in mode {mode} (sum and mean are covered)"
    if per_sample is not None or include_last not in (None, False) or padding not in (None, -1):
        return "an embedding bag with per-sample weights, include_last_offset or padding_idx"
    spec = leaf_spec(problem, weight) if is_ref(weight) else None
    ins = problem.inputs
    if spec is None or len(spec.shape) != 2 or spec.dtype not in CTYPES:
        return "the table is not a 2-D fp32, fp16 or bf16 parameter"
    if (indices, offsets) != ("in0", "in1") or len(ins) != 2 or any(t.dtype != "int64" or len(t.shape) != 1 for t in ins):
        return "needs 1-D int64 indices and offsets as the forward's inputs"
    if problem.graph_outputs not in ((node.out,), (f"{node.out}.0",)):
        return "the forward's output is not the bags' values"
    rows, dim = spec.shape
    bags = ins[1].shape[0]
    out = problem.outputs[0] if problem.outputs and len(problem.outputs) == 1 else None
    if out is None or tuple(out.shape) != (bags, dim) or out.dtype != spec.dtype:
        return "the output is not one row of the table's dtype per bag"
    if bags >= 2**31:
        return "more bags than one grid holds"
    return BagMatch(weight, rows, dim, bags, MODES[mode] == "mean", spec.dtype)


@family(290)
class EmbeddingBag(GraphFamily):
    """A warp per bag (WARPS a block), VEC elements a lane per load (16 bytes, or one where a row is not
    a whole number of 16-byte words), UNROLL of the bag's rows loaded before any is summed."""

    anchors = frozenset({"_embedding_bag"})

    def __init__(self) -> None:
        super().__init__("embedding_bag", {"WARPS": (2, 4, 8), "VEC": (1, 4, 8), "UNROLL": (1, 2, 4, 8)})

    def match(self, problem: Problem) -> BagMatch | str:
        return match_embedding_bag(problem)

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        m = self.matched(problem)
        return c["VEC"] == 1 or (c["VEC"] == per_16_bytes(m.dtype) and m.dim % c["VEC"] == 0)

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        m = self.matched(problem)
        vec = per_16_bytes(m.dtype) if m.dim % per_16_bytes(m.dtype) == 0 else 1
        out = [dict(WARPS=4, VEC=vec, UNROLL=4), dict(WARPS=8, VEC=vec, UNROLL=8), dict(WARPS=4, VEC=vec, UNROLL=2),
               dict(WARPS=4, VEC=1, UNROLL=4)]
        return [c for i, c in enumerate(out) if c not in out[:i] and self.valid(c, problem)]

    def extra(self, problem: Problem) -> dict[str, Any]:
        m = self.matched(problem)
        return {"CTYPE": CTYPES[m.dtype], "DIM": m.dim, "ROWS": m.rows, "MEAN": m.mean}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        m = self.matched(problem)
        return LaunchSpec(entry=self.name, grid=f"(cdiv(bags, {c['WARPS']}),)", block=f"({c['WARPS'] * 32},)",
                          args=(m.weight, "in0", "in1", "out0", "n_idx", "bags"), outputs=((f"({m.bags}, {m.dim})", m.dtype),),
                          bindings=(("n_idx", "in0.numel()"), ("bags", "in1.numel()")))
