"""fp32 1x1 convolutions of stride 1 without padding as the GEMM they are, read as they lie: image n's
output [C_out, pixels] = W [C_out, C] @ x[n] [C, pixels], then the convolution's epilogue. gemm_f32's
mma.sync kernel takes both operands in place (W rows of k, x's planes rows of pixels) with one W for every
image, so no channels-last copy of x is written and read again, as the implicit-GEMM convolution's wgmma
needs for TF32 (its operands k-major only). Where the precision contract lets the output carry TF32's
rounding (a convolution under PyTorch's default flags, whose cuDNN runs TF32) one TF32 product a step;
else three (fp32 accuracy). Runs on sm_80 and later."""

from __future__ import annotations

import math
from typing import Any

from cuforge.kernels.base import SEED_SMS, SMEM_LIMIT, GraphFamily, cdiv, fills_gpu, tiles
from cuforge.kernels.conv_match import ConvMatch, match_conv, pointwise
from cuforge.kernels.registry import family
from cuforge.kernels.tf32_tiles import tf32_tiles_valid
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec
from cuforge.sandbox.protocol.precision import tf32_allowed

# Blocks a problem must run, in SMs' worth, for the resident-W seeds to lead (see seeds()).
MANY_WAVES = 16


def blocks_of(channels_out: int, pixels: int, c: dict[str, Any]) -> int:
    """Blocks an image takes: NT tiles each, within one block row of W where A_RES keeps it resident."""
    if c.get("A_RES"):
        return cdiv(channels_out, c["BM"]) * cdiv(cdiv(pixels, c["BN"]), c["NT"])
    return cdiv(tiles(channels_out, pixels, c["BM"], c["BN"]), c.get("NT", 1))


@family(252)
class ConvPointwiseF32(GraphFamily):
    """gemm_f32's tiles over (output channels, pixels) for each image; MATH tf32 (one product) or tf32x3;
    NT tiles a block, one after another in one pipeline (the next tile's loads overlap this one's stores);
    A_RES keeps the block's rows of W for all input channels in shared memory across its tiles."""

    template = "gemm_f32"
    anchors = frozenset({"convolution"})
    DEFAULTS = {"NT": 1, "A_RES": 0}  # a stored config from before either knob: one tile a block, W per tile

    def __init__(self) -> None:
        super().__init__("conv_pointwise_f32", {
            "BM": (32, 64, 128), "BN": (64, 128, 256), "BK": (16, 32), "WM": (1, 2, 4), "WN": (1, 2, 4),
            "STAGES": (2, 3, 4, 5), "GROUP_M": (1, 8), "MATH": ("tf32", "tf32x3"), "PROMOTE": (1,),
            "NT": (1, 2, 4, 8), "A_RES": (0, 1)})

    def match(self, problem: Problem) -> ConvMatch | str:
        found = match_conv(problem)
        if isinstance(found, str):
            return found
        return pointwise(found) or found

    def leads(self, problem: Problem) -> bool:
        """Ahead of the implicit GEMM where one TF32 product is allowed: on level1/87 (64 -> 128 channels,
        1M pixels) 4.5 ms against its 6.4 ms, both timed beside cuDNN's TF32 (3.4 ms). With three
        products it has not been timed against it."""
        f = self.match(problem)
        return not isinstance(f, str) and tf32_allowed(problem.contract(), problem.ops)

    def reduced_precision(self, config: dict[str, Any], problem: Problem | None = None) -> bool:
        return config.get("MATH") == "tf32"

    @staticmethod
    def smem_bytes(c: dict[str, Any], channels: int = 0) -> int:
        """W's tile rows of BK (+8) and x's BK rows of BN pixels (+4) a stage: gemm_f32's layout with
        TA = TB = 0; with A_RES, W's rows of all `channels` (rounded up to BK, +8) once instead."""
        x_tiles = c["STAGES"] * c["BK"] * (c["BN"] + 4)
        if c.get("A_RES"):
            return (c["BM"] * (cdiv(channels, c["BK"]) * c["BK"] + 8) + x_tiles) * 4
        return (c["STAGES"] * c["BM"] * (c["BK"] + 8) + x_tiles) * 4

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        f = self.match(problem)
        if isinstance(f, str):
            return False
        if c.get("A_RES") and c.get("NT", 1) < 2:
            return False  # W's rows are kept for the block's later tiles: one tile a block has none
        # Three products: at most 64 accumulators compile without spills on sm_90a (ptxas -v).
        return tf32_tiles_valid(c, problem, 64) and self.smem_bytes(c, f.c) <= SMEM_LIMIT

    # W resident across four or eight tiles a block leads: on level1/87 (64 -> 128 channels, 1M pixels,
    # one TF32 product) 3.85-3.90 ms against 4.46-4.51 with W loaded for each tile, which took 4.5 ms
    # at NT 4 against 5.7 ms at NT 1 (three stages).
    PRESETS: tuple[dict[str, Any], ...] = (
        dict(BM=128, BN=128, BK=32, WM=2, WN=4, STAGES=3, GROUP_M=8, NT=4, A_RES=1),
        dict(BM=128, BN=128, BK=32, WM=2, WN=4, STAGES=4, GROUP_M=8, NT=8, A_RES=1),
        dict(BM=128, BN=64, BK=32, WM=2, WN=2, STAGES=4, GROUP_M=8, NT=8, A_RES=1),
        dict(BM=128, BN=128, BK=32, WM=2, WN=4, STAGES=3, GROUP_M=8, NT=4),
        dict(BM=128, BN=128, BK=32, WM=2, WN=4, STAGES=2, GROUP_M=8, NT=4),
        dict(BM=128, BN=128, BK=32, WM=2, WN=4, STAGES=3, GROUP_M=8),
        dict(BM=64, BN=128, BK=32, WM=2, WN=2, STAGES=4, GROUP_M=8),
        dict(BM=128, BN=256, BK=16, WM=2, WN=4, STAGES=4, GROUP_M=8),
        dict(BM=64, BN=64, BK=32, WM=2, WN=2, STAGES=4, GROUP_M=1),
        dict(BM=32, BN=64, BK=32, WM=1, WN=2, STAGES=4, GROUP_M=1),
    )

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        """The presets that fill the GPU first; each with one TF32 product first where the contract allows
        it, else with three."""
        f = self.matched(problem)
        pixels = math.prod(f.out_spatial)
        maths = ("tf32", "tf32x3") if tf32_allowed(problem.contract(), problem.ops) else ("tf32x3",)
        out = [{**self.DEFAULTS, **c, "MATH": m, "PROMOTE": 1} for m in maths for c in self.PRESETS]
        # W resident only where it leaves room for two blocks an SM (as on level1/87): over many input
        # channels it would take the second block's place, which has not been timed.
        # With one TF32 product only: three held 255 registers and spilled (ptxas -v on sm_90a).
        out = [c for c in out if self.valid(c, problem) and (not c["A_RES"] or (
            c["MATH"] == "tf32" and self.smem_bytes(c, f.c) <= SMEM_LIMIT // 2))]

        def blocks(c: dict[str, Any]) -> int:
            return blocks_of(f.c_out, pixels, c) * f.n

        def resident_last(c: dict[str, Any]) -> bool:
            # W resident leads only over many waves of blocks: on level1/87 (32k blocks) 3.85-3.90 ms
            # against 4.46-4.51 with W loaded each tile, but in the CNN blocks' 1x1 convolutions (16
            # images of 56 x 56 pixels, about 200 blocks) their pipelines took 0.275-0.293 ms with it and
            # 0.217-0.251 without (MobileNetV2), 0.287 against 0.222 (ResNet's 64 -> 256).
            return bool(c["A_RES"]) and blocks(c) < MANY_WAVES * SEED_SMS

        # Stable: the presets' order among those that fill the GPU; the most blocks first among the rest.
        return sorted(out, key=lambda c: (c["MATH"] != maths[0], resident_last(c), not fills_gpu(blocks(c)),
                                          -min(blocks(c), SEED_SMS)))

    def extra(self, problem: Problem) -> dict[str, Any]:
        f = self.matched(problem)
        pixels = math.prod(f.out_spatial)
        # 16-byte copies need rows of W (C values) and of x's planes (pixels) in whole 16 bytes.
        return {"TA": False, "TB": False, "VA": 4 if f.c % 4 == 0 else 1, "VB": 4 if pixels % 4 == 0 else 1,
                "BATCHED": True, "A_SHARED": True, "EPI": f.epilogue, "KRES": f.c}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        f = self.matched(problem)
        out_shape = (f.n, f.c_out, *f.out_spatial)
        # M, K, N: output channels, input channels, pixels an image; rows of C run over (image, channel),
        # the flat row the convolution's epilogue reads its channel from (row % C_out).
        tiles_per_block = c.get("NT", 1)
        # A_RES: each block row of W over NT tiles along the pixels; else any NT consecutive tiles.
        blocks = (f"cdiv(M, {c['BM']}) * cdiv(cdiv(N, {c['BN']}), {tiles_per_block})" if c.get("A_RES")
                  else f"cdiv(cdiv(M, {c['BM']}) * cdiv(N, {c['BN']}), {tiles_per_block})")
        return LaunchSpec(entry=self.name, grid=f"({blocks}, BATCH)",
                          block=f"({c['WM'] * c['WN'] * 32},)", shared_mem=str(self.smem_bytes(c, f.c)),
                          args=(f.w, f.x, "out0", "M", "N", "K", *f.epilogue.launch_args()),
                          outputs=((repr(out_shape), "float32"),),
                          bindings=(("M", f"{f.w}.shape[0]"), ("K", f"{f.w}.shape[1]"),
                                    ("N", f"{f.x}.numel() // ({f.x}.shape[0] * {f.x}.shape[1])"),
                                    ("BATCH", f"{f.x}.shape[0]")))
