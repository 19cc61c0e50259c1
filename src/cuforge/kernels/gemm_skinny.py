"""A GEMM of a few rows through a linear layer's weight (decode's GEMV, speculative decoding's verify
step, a small batch): Y = epilogue(X @ W^T) with X [M, K], M at most 16, and W [N, K] as nn.Linear
stores it; fp32, fp16 or bf16 with fp32 sums, the output in the inputs' dtype. Such a product reads
W once and does little else, so the kernel streams W at the copy bandwidth and uses each load of it
for every row of X. A half-precision matrix-vector product A @ v (v [K, 1]) is the same product with
v as the one row and A as the weight: its [M, 1] result is the [1, M] row in memory."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cuforge.kernels.base import SEED_SMS, Family
from cuforge.kernels.chains import CTYPES, per_16_bytes
from cuforge.kernels.fp32 import GemmMatch, match_gemm
from cuforge.kernels.gemm import HALF_ELEMENTS
from cuforge.kernels.registry import family
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec

MAX_ROWS = 16
_DTYPES = ("float32", "bfloat16", "float16")


def match_skinny(problem: Problem) -> GemmMatch | str:
    """The problem as X @ W^T (+ epilogue) with few rows, or why it is not one."""
    if not problem.inputs or problem.inputs[0].is_scalar:
        return "no tensor input"
    dtype = problem.inputs[0].dtype
    if dtype not in _DTYPES:
        return f"inputs of {dtype}, not fp32, fp16 or bf16"
    found = match_gemm(problem, dtype)
    if isinstance(found, str):
        return found
    if found.batched or found.ta or found.epilogue.rowsum:
        return "not a plain product of rows and a weight"
    if (found.n == 1 and not found.tb and not found.a_merged and dtype != "float32" and not found.epilogue.tensors
            and not found.epilogue.indexed and found.out_shape == (found.m, 1)):
        # A @ v: v's K values are the one row, A [M, K] the weight (an fp32 one is gemv_f32's, measured there).
        return replace(found, a=found.b, b=found.a, tb=True, m=1, n=found.m)
    if not found.tb:
        return "the weight is not stored [N, K] (as nn.Linear stores it)"
    if found.m > MAX_ROWS:
        return f"{found.m} rows of activations (this family takes at most {MAX_ROWS})"
    return found


@family(45)
class GemmSkinny(Family):
    """Weight-streaming GEMM for 1-16 rows: each warp reads COLS rows of W by 16-byte loads (UNROLL in
    flight a lane), KSPLIT warps share a column over slices of K, and the traced epilogue is applied
    before the output is rounded to the inputs' dtype."""

    anchors = frozenset({"mm", "addmm"})

    def __init__(self) -> None:
        super().__init__("gemm_skinny", {"BLOCK": (128, 256), "COLS": (1, 2, 4), "UNROLL": (1, 2, 4),
                                         "KSPLIT": (1, 2, 4)})

    def supports(self, problem: Problem) -> str | None:
        found = match_skinny(problem)
        return found if isinstance(found, str) else None

    def leads(self, problem: Problem) -> bool:
        # One row (decode's GEMV): measured 1.2x eager in fp32, bf16 and fp16 on an H200, ahead of the
        # wgmma linear family's 64-row tiles. At 8 half-precision rows it lost to cuBLAS (0.6x): there
        # gemm_skinny_tc leads.
        found = match_skinny(problem)
        return not isinstance(found, str) and found.m == 1

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        found = match_skinny(problem)
        if isinstance(found, str):
            return False
        # Registers: the sums (rows x columns) and the loads in flight (columns x unroll 16-byte words).
        return (c["BLOCK"] // 32) % c["KSPLIT"] == 0 and found.m * c["COLS"] <= 32 and c["COLS"] * c["UNROLL"] <= 8

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        found = match_skinny(problem)
        assert not isinstance(found, str)
        # Enough warps for every SM several times over: K split among the warps of a block where the
        # columns alone leave SMs idle. On an H200, 8 x 4096 through a 4096 x 4096 weight: two columns a
        # warp and K in four slices ran 45 us in fp32 against 50-107 for the other seeds; 11008 columns
        # of one row: two columns a warp, K whole, within 2% of the best (benchmarks/results/skinny_gemm_s46.json).
        few_columns = found.n < 64 * SEED_SMS
        first = (dict(BLOCK=256, COLS=2, UNROLL=2, KSPLIT=4) if few_columns
                 else dict(BLOCK=256, COLS=2, UNROLL=2, KSPLIT=1))
        others = [dict(BLOCK=128, COLS=2, UNROLL=2, KSPLIT=2), dict(BLOCK=256, COLS=1, UNROLL=2, KSPLIT=4),
                  dict(BLOCK=256, COLS=4, UNROLL=1, KSPLIT=4), dict(BLOCK=256, COLS=1, UNROLL=4, KSPLIT=2),
                  dict(BLOCK=256, COLS=2, UNROLL=2, KSPLIT=1)]
        return [c for c in [first, *[o for o in others if o != first]] if self.valid(c, problem)]

    def extra(self, problem: Problem) -> dict[str, Any]:
        found = match_skinny(problem)
        assert not isinstance(found, str)
        dtype = problem.inputs[0].dtype
        return {"EPI": found.epilogue, "CTYPE": CTYPES[dtype], "ROWS": found.m,
                "VECTOR": found.k % per_16_bytes(dtype) == 0}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        f = match_skinny(problem)
        assert not isinstance(f, str)
        columns_a_block = (c["BLOCK"] // 32 // c["KSPLIT"]) * c["COLS"]
        return skinny_launch(self.name, f, problem, f"(cdiv(N, {columns_a_block}),)", f"({c['BLOCK']},)")


def skinny_launch(entry: str, f: GemmMatch, problem: Problem, grid: str, block: str) -> LaunchSpec:
    """Both skinny kernels' launch: (X, W, Y, M, N, K, the epilogue's operands), M the rows X holds."""
    out = repr(f.out_shape) if f.a_merged or f.out_shape != (f.m, f.n) else "(M, N)"
    return LaunchSpec(entry=entry, grid=grid, block=block, args=(f.a, f.b, "out0", "M", "N", "K", *f.epilogue.launch_args()),
                      outputs=((out, problem.inputs[0].dtype),),
                      bindings=(("K", f"{f.b}.shape[1]"), ("N", f"{f.b}.shape[0]"), ("M", f"{f.a}.numel() // K")))


def match_skinny_tc(problem: Problem) -> GemmMatch | str:
    """The problem as gemm_skinny_tc takes it (fp16/bf16, K in whole 16-byte words), or why not."""
    found = match_skinny(problem)
    if isinstance(found, str):
        return found
    dtype = problem.inputs[0].dtype
    if dtype not in HALF_ELEMENTS:
        return f"inputs of {dtype}: the tensor-core skinny GEMM takes fp16 or bf16"
    if found.k % 8:
        return f"K = {found.k} is not a multiple of 8 (16-byte loads of fp16/bf16)"
    return found


@family(46)
class GemmSkinnyTC(Family):
    """Weight-streaming GEMM for 1-16 rows of fp16/bf16 on the tensor cores: W [N, K] is the m16n8k16
    product's 16-row side and X the 8-column one, loaded as fragments straight from global memory;
    WT 16-row tiles of W a warp, KSPLIT warps of a block over K, UNROLL chunks of 32 k in flight, OCC the
    warps an SM should hold at once (the register budget; 0 leaves it to the compiler)."""

    anchors = frozenset({"mm", "addmm"})
    template = "gemm_skinny_tc"

    def __init__(self) -> None:
        super().__init__("gemm_skinny_tc", {"WT": (1, 2), "UNROLL": (1, 2, 4), "KSPLIT": (4, 8, 16),
                                            "OCC": (0, 24, 32)})

    def supports(self, problem: Problem) -> str | None:
        found = match_skinny_tc(problem)
        return found if isinstance(found, str) else None

    def leads(self, problem: Problem) -> bool:
        # From 2 rows up the CUDA-core kernel converts and multiplies each W element once a row and
        # becomes bound by its arithmetic (8 half rows: 0.7x cuBLAS); the tensor cores are not.
        found = match_skinny_tc(problem)
        return not isinstance(found, str) and found.m > 1

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        # Registers: the loads in flight (UNROLL x (2 WT + TILES) 16-byte words) and the sums, within
        # the budget OCC warps an SM leave (64K registers an SM): 4 a word plus about 24.
        found = match_skinny_tc(problem)
        if isinstance(found, str) or c["UNROLL"] * c["WT"] > 4:
            return False
        needed = 4 * c["UNROLL"] * (2 * c["WT"] + -(-found.m // 8)) + 24
        return c["OCC"] == 0 or needed <= 65536 // (32 * c["OCC"])

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        found = match_skinny_tc(problem)
        assert not isinstance(found, str)
        # Warps enough to keep every SM's loads in flight. On an H200 (benchmarks/results/skinny_gemm_s51b.json,
        # every config): 8 x 4096 through a 4096 x 4096 weight ran fastest with K split 16 ways, two
        # chunks in flight a lane and 32 warps an SM (11.2 us, 8-way 11.7); one row through 11008 x 4096
        # with 4 ways (its 688 tiles fill the GPU alone).
        tiles = -(-found.n // 16)
        first = dict(WT=1, UNROLL=2, KSPLIT=16 if tiles < 4 * SEED_SMS else 4, OCC=32)
        others = [dict(WT=1, UNROLL=2, KSPLIT=8, OCC=32), dict(WT=1, UNROLL=2, KSPLIT=4, OCC=32),
                  dict(WT=1, UNROLL=2, KSPLIT=16, OCC=32), dict(WT=1, UNROLL=2, KSPLIT=8, OCC=24),
                  dict(WT=1, UNROLL=2, KSPLIT=16, OCC=0), dict(WT=2, UNROLL=2, KSPLIT=16, OCC=32)]
        return [c for c in [first, *[o for o in others if o != first]] if self.valid(c, problem)]

    def extra(self, problem: Problem) -> dict[str, Any]:
        found = match_skinny_tc(problem)
        assert not isinstance(found, str)
        return {"EPI": found.epilogue, "ELEM": HALF_ELEMENTS[problem.inputs[0].dtype], "HALF": True,
                "TILES": -(-found.m // 8)}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        f = match_skinny_tc(problem)
        assert not isinstance(f, str)
        return skinny_launch(self.name, f, problem, f"(cdiv(N, {16 * c['WT']}),)", f"({32 * c['KSPLIT']},)")
