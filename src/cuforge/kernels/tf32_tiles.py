"""The tile rules of the fp32 convolution families on mma.sync's m16n8k8 TF32 product (the 1x1 GEMM of
x as it lies, the row-ring convolution): a block's WM x WN warps, each a whole number of 16 x 8 products,
one TF32 product only where the precision contract allows TF32, and the accumulators a thread may hold."""

from __future__ import annotations

from typing import Any

from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.precision import tf32_allowed


def accumulators(c: dict[str, Any]) -> int:
    """The fp32 sums a thread holds: four for each 16 x 8 product of its warp's tile."""
    return (c["BM"] // c["WM"] // 16) * (c["BN"] // c["WN"] // 8) * 4


def tf32_tiles_valid(c: dict[str, Any], problem: Problem, most_three: int) -> bool:
    """Whether config `c` (BM, BN, WM, WN, MATH) tiles a block: 2, 4 or 8 warps of whole products; MATH
    tf32 (one product) only under a contract that lets the output carry TF32's rounding; at least 16
    accumulators a thread and at most 128 with one product, `most_three` with three (which hold each
    operand fragment twice, big and small parts: more spills)."""
    if c["WM"] * c["WN"] not in (2, 4, 8) or c["BM"] % (16 * c["WM"]) or c["BN"] % (8 * c["WN"]):
        return False
    one = c["MATH"] == "tf32"
    if one and not tf32_allowed(problem.contract(), problem.ops):
        return False
    return 16 <= accumulators(c) <= (128 if one else most_three)
