"""Top-k over the last dim (torch.topk, sorted): LLM sampling's 50 largest logits of a 32000-token row,
a retrieval's nearest scores. A block a row: a radix select over order-preserving 32-bit keys finds the
k-th value in four passes, the values above it and the first equal ones are gathered and sorted in
shared memory. fp32, fp16 or bf16 values (copied, never rounded), int64 indices (fp32 only: in half
precision equal values are common, and PyTorch's order among them is its sort's accident); equal values
come lowest index first."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cuforge.kernels.base import SMEM_LIMIT, GraphFamily
from cuforge.kernels.chains import CTYPES
from cuforge.kernels.leaves import leaf_spec
from cuforge.kernels.registry import family
from cuforge.op_graph import is_last_dim, is_ref
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec

MAX_K = 1024  # the sort runs in one block's shared memory


@dataclass(frozen=True)
class TopkMatch:
    x: str
    rows: int
    n: int
    k: int
    largest: bool
    dtype: str
    shape: tuple[int, ...]  # the outputs': the input's with k in the last dim
    values_out: bool  # which of (values, indices) the forward returns
    indices_out: bool


def match_topk(problem: Problem) -> TopkMatch | str:
    g = problem.graph
    if len(g) != 1 or g[0].op != "topk":
        return "not one top-k"
    node = g[0]
    x, k, dim, largest, ordered = (tuple(node.args) + (None,) * 5)[:5]
    dim = node.kwarg("dim", -1 if dim is None else dim)
    largest = node.kwarg("largest", True if largest is None else largest)
    ordered = node.kwarg("sorted", True if ordered is None else ordered)
    spec = leaf_spec(problem, x) if is_ref(x) else None
    if spec is None or spec.dtype not in CTYPES or not spec.shape:
        return "the top-k's input is not an fp32, fp16 or bf16 input or parameter"
    if not is_last_dim(dim, len(spec.shape)):
        return f"a top-k over dim {dim}, not the last"
    if ordered is not True:
        return "an unsorted top-k: the order of its results is PyTorch's choice"
    n = spec.shape[-1]
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= min(n, MAX_K):
        return f"a top-k of k={k!r} (1 to {MAX_K}, at most the row's {n})"
    outs = tuple(problem.graph_outputs)
    wanted = {node.out: "values", f"{node.out}.0": "values", f"{node.out}.1": "indices"}
    if not outs or len(outs) > 2 or any(o not in wanted for o in outs) or len({wanted[o] for o in outs}) != len(outs):
        return "the forward's outputs are not the top-k's values and indices"
    named = [wanted[o] for o in outs]
    if named == ["indices", "values"]:
        return "the forward returns the top-k's indices before its values"
    if "indices" in named and spec.dtype != "float32":
        return ("the indices of a half-precision top-k: equal values are common there, and PyTorch orders them as its "
                "sort happens to, which no other kernel reproduces")
    rows = math.prod(spec.shape[:-1])
    if rows >= 2**31 or n >= 2**31:
        return "more rows or a longer row than one grid holds"
    return TopkMatch(x, rows, n, k, bool(largest), spec.dtype, (*spec.shape[:-1], k), "values" in named, "indices" in named)


@family(300)
class TopkRows(GraphFamily):
    """THREADS a row's block; CACHE keeps the row's keys in shared memory after the first radix pass."""

    anchors = frozenset({"topk"})

    def __init__(self) -> None:
        super().__init__("topk_rows", {"THREADS": (256, 512, 1024), "CACHE": (0, 1)})

    def match(self, problem: Problem) -> TopkMatch | str:
        return match_topk(problem)

    @staticmethod
    def sort_width(m: TopkMatch) -> int:
        return max(32, 1 << (m.k - 1).bit_length())

    def smem_bytes(self, c: dict[str, Any], m: TopkMatch) -> int:
        """Static (the per-warp histograms, the sort's keys and indices) and, CACHE, the row's keys."""
        static = c["THREADS"] // 32 * 256 * 4 + self.sort_width(m) * 8 + 256
        return static + (4 * m.n if c["CACHE"] else 0)

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        m = self.matched(problem)
        return self.smem_bytes(c, m) <= SMEM_LIMIT

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        out = [dict(THREADS=1024, CACHE=1), dict(THREADS=512, CACHE=1), dict(THREADS=1024, CACHE=0), dict(THREADS=256, CACHE=0)]
        return [c for c in out if self.valid(c, problem)]

    def extra(self, problem: Problem) -> dict[str, Any]:
        m = self.matched(problem)
        return {"CTYPE": CTYPES[m.dtype], "N": m.n, "K": m.k, "KP": self.sort_width(m), "LARGEST": m.largest}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        m = self.matched(problem)
        outputs, scratch, args = topk_outputs(m)
        return LaunchSpec(entry=self.name, grid=f"({m.rows},)", block=f"({c['THREADS']},)", args=(m.x, *args),
                          outputs=outputs, scratch=scratch, shared_mem=str(4 * m.n if c["CACHE"] else 0))


def topk_outputs(m: TopkMatch, scratch_before: tuple[tuple[str, str, str], ...] = ()) -> tuple[tuple, tuple, tuple[str, ...]]:
    """The launch's outputs, scratch buffers (after `scratch_before`) and the values/indices arguments: what
    the forward does not return is still written, to a scratch buffer."""
    shape = repr(m.shape)
    values, indices = (shape, m.dtype), (shape, "int64")
    outputs: list = []
    scratch: list = list(scratch_before)
    args = []
    for spec, kept in ((values, m.values_out), (indices, m.indices_out)):
        (outputs if kept else scratch).append(spec if kept else (*spec, "empty"))
        args.append(f"out{len(outputs) - 1}" if kept else f"scratch{len(scratch) - 1}")
    return tuple(outputs), tuple(scratch), tuple(args)
