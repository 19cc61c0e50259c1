"""Decode's GEMV with its weight streamed by bulk copies: Y = epilogue(X @ W^T) for 1-4 rows of X,
W [N, K] as nn.Linear stores it (fp32, fp16 or bf16, fp32 sums). One block an SM, each with an equal
run of W's rows, brought into a ring of shared-memory stages by the TMA engine and multiplied there
against X (kept in shared memory); a block's share differs from another's by at most one row.

Why beside gemm_skinny: its grid of many small blocks streamed one bf16 row through 11008 x 4096 at
0.77 of the copy bandwidth on an H200 (688 blocks of 16 rows over 132 SMs leave some SMs a block more
than others), where the fp32 product reached 0.88."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cuforge.kernels.base import GraphFamily, sm_count
from cuforge.kernels.chains import CTYPES, per_16_bytes
from cuforge.kernels.gemm_skinny import match_skinny, skinny_launch
from cuforge.kernels.registry import family
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec

MAX_ROWS = 4  # rows of X: each lane sums one value a row
SMEM_BYTES = 220 * 1024  # of an H100/H200 SM's 227 KB a block may take, with room for the barriers
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def smem_bytes(m: int, k: int, dtype: str, warps: int, stages: int) -> int:
    """X's rows (padded to 16 bytes) and the ring of `stages` stages of `warps` rows of W."""
    es = ELEMENT_BYTES[dtype]
    return -(-m * k * es // 16) * 16 + stages * warps * k * es


@family(47)
class GemmSkinnyBulk(GraphFamily):
    """A block an SM over an equal run of W's rows; WARPS rows a stage (a warp a row), STAGES stages in
    the ring, so (STAGES - 1) x WARPS rows stream in while a stage is multiplied."""

    anchors = frozenset({"mm", "addmm"})
    template = "gemm_skinny_bulk"

    def __init__(self) -> None:
        super().__init__("gemm_skinny_bulk", {"WARPS": (4, 8), "STAGES": (2, 3, 4)})

    def match(self, problem: Problem) -> Any:
        found = match_skinny(problem)
        if isinstance(found, str):
            return found
        if found.m > MAX_ROWS:
            return f"{found.m} rows of activations (this family takes at most {MAX_ROWS})"
        dtype = problem.inputs[0].dtype
        if found.k % per_16_bytes(dtype):
            return f"K = {found.k} is no whole number of 16-byte pieces (bulk copies move 16-byte multiples)"
        if smem_bytes(found.m, found.k, dtype, 4, 2) > SMEM_BYTES:
            return f"K = {found.k}: two stages of four rows and X do not fit in shared memory"
        return found

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        found = self.match(problem)
        if isinstance(found, str):
            return False
        return smem_bytes(found.m, found.k, problem.inputs[0].dtype, c["WARPS"], c["STAGES"]) <= SMEM_BYTES

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        # The deepest ring that fits: the stages in flight are what keeps the SM's share of the copy
        # bandwidth busy (about 30 KB a microsecond an SM on an H200).
        out = [dict(WARPS=w, STAGES=s) for w, s in ((8, 3), (8, 4), (4, 4), (8, 2), (4, 3), (4, 2))]
        return [c for c in out if self.valid(c, problem)][:3]

    def extra(self, problem: Problem) -> dict[str, Any]:
        found = self.matched(problem)
        return {"EPI": found.epilogue, "CTYPE": CTYPES[problem.inputs[0].dtype], "ROWS": found.m}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        f = self.matched(problem)
        spec = skinny_launch(self.name, f, problem, "(min(SMS, N),)", f"({32 * c['WARPS']},)")
        # The kernel is built for the traced rows (ROWS), so the traced shape sizes its shared memory.
        shared = smem_bytes(f.m, f.k, problem.inputs[0].dtype, c["WARPS"], c["STAGES"])
        return replace(spec, shared_mem=str(shared), bindings=(*spec.bindings, sm_count(f.b)))
