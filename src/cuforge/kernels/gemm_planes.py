"""fp16/bf16 GEMMs of any layout on Hopper: the products the fp16/bf16 TMA families cannot read as they
lie (batched, A used transposed, rows that are no whole 16 bytes) run on gemm_tf32x3_sm90's kernel with fp16/bf16 wgmma. A preparing kernel copies each operand
into one K-major plane of its own elements, rows padded to 16 bytes; the k-tile is 64 elements, sums
are fp32, the traced epilogue runs in fp32 and the output is rounded once to the inputs' dtype: what
cuBLAS computes for a half GEMM, so no precision contract is needed."""

from __future__ import annotations

from typing import Any

from cuforge.kernels.base import SEED_SMS, GraphFamily, tiles
from cuforge.kernels.fp32 import GemmMatch, match_gemm
from cuforge.kernels.gemm import HALF_ELEMENTS
from cuforge.kernels.gemm_tf32 import GemmTf32x3Sm90
from cuforge.kernels.registry import family
from cuforge.problems.problem import Problem


@family(55)
class GemmPlanesSm90(GemmTf32x3Sm90):
    """gemm_tf32x3_sm90's tiles, stages and grouped rasterization over fp16/bf16 planes, batches over
    gridDim.y; one plane an operand (no split), so a stage holds twice the TF32 kernel's k-tiles' worth."""

    BK = 64
    PLANES = 1

    def __init__(self) -> None:  # the TF32 family's tile knobs, under this family's name; no split-K (half atomics)
        GraphFamily.__init__(self, "gemm_planes_sm90", {"BN": (64, 128, 192), "STAGES": (2, 3, 4, 5, 6), "GROUP_M": (1, 8, 16)})

    DEFAULTS: dict[str, Any] = {}

    def match(self, problem: Problem) -> GemmMatch | str:
        dtype = problem.inputs[0].dtype if problem.inputs else None
        if dtype not in HALF_ELEMENTS:
            return f"inputs of {dtype}, not fp16 or bf16"
        found = match_gemm(problem, dtype)
        if isinstance(found, str):
            return found
        if found.n < 8 or found.m < 16:
            return "too few rows or columns for tensor-core tiles"
        if found.epilogue.rowsum:
            return "a row sum of a half-precision GEMM: its sums would be fp32 atomics"
        # Row-major operands with 16-byte rows are the fp16/bf16 TMA families' (with a pointwise kernel
        # after them where they do not fuse the epilogue): here a pass would copy a weight before every
        # product, unmeasured against them, and the search's evaluations stay with the families made for it.
        if not found.batched and not found.ta and found.k % 8 == 0 and found.n % 8 == 0:
            return "its operands are row-major with 16-byte rows: the fp16/bf16 TMA families read them as they lie"
        return found

    def dtype(self, problem: Problem) -> str:
        return problem.inputs[0].dtype

    @classmethod
    def stage_bytes(cls, c: dict[str, Any]) -> int:
        return (cls.BM + c["BN"]) * 128  # one k-tile of A and of B

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        f = self.matched(problem)
        out = []
        for bn in (128, 64, 192):
            fits = [s for s in self.knobs["STAGES"] if self.valid({"BN": bn, "STAGES": s, "GROUP_M": 8}, problem)]
            if fits:
                out.append({"BN": bn, "STAGES": max(fits), "GROUP_M": 8})
        # Narrower tiles first when 128-wide ones leave SMs idle.
        if len(out) > 1 and tiles(f.m, f.n, self.BM, 128) * f.batch() < SEED_SMS:
            out[0], out[1] = out[1], out[0]
        return out

    def extra(self, problem: Problem) -> dict[str, Any]:
        return {**super().extra(problem), "HALF": 1, "ELEM": HALF_ELEMENTS[self.dtype(problem)], "BK": self.BK,
                "SPLIT": "pass", "SPLIT_K": 1}
