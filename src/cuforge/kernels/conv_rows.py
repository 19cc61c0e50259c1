"""fp32 2-D convolutions of stride 1 (a 3x3 over few channels: level1/63, a CNN's early layers) as a
GEMM of W with the input's patches, read in place: x [N, C, H, W] and y [N, C_out, H_out, W_out] as they
lie, no im2col and no channels-last copy. A block keeps W's rows for all of K = C*KH*KW in shared memory
and walks down an image's output rows, each input row loaded once into a ring and read by the KH output
rows that need it; the mma's B fragments are read from the ring at their taps. One TF32 product a step
where the precision contract allows TF32 (cuDNN's convolutions under PyTorch's default flags), else three.
Runs on sm_80 and later. Ranked after the implicit GEMM; leads it where one TF32 product is allowed and
W's rows fit 64 at a time (few input channels: leads())."""

from __future__ import annotations

from typing import Any, ClassVar

from cuforge.kernels.base import SEED_SMS, SMEM_LIMIT, GraphFamily, cdiv, fills_gpu
from cuforge.kernels.conv_match import ConvMatch, match_conv
from cuforge.kernels.registry import family
from cuforge.kernels.tf32_tiles import tf32_tiles_valid
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec
from cuforge.sandbox.protocol.precision import tf32_allowed


def refusal(f: ConvMatch) -> str | None:
    """Why the convolution is not this family's (2-D, stride 1, undilated, ungrouped, fp32), or None."""
    if f.transposed or f.groups != 1 or f.pool:
        return "a transposed, grouped or pooled convolution"
    if f.dims != 2:
        return f"a {f.dims}-D convolution: conv_rows_f32 walks the rows of 2-D images"
    if set(f.stride) != {1} or set(f.dilation) != {1}:
        return f"stride {f.stride}, dilation {f.dilation}: conv_rows_f32 takes stride 1 undilated only"
    if f.dtype != "float32":
        return f"{f.dtype} operands: conv_rows_f32 is fp32"
    return None


def k_padded(f: ConvMatch) -> int:
    """K as the kernel lays it out: the taps times the channels rounded up to 8."""
    return f.taps * cdiv(f.c, 8) * 8


@family(254)
class ConvRowsF32(GraphFamily):
    """BM output channels x BN output columns a block over NT output rows of one image; WM x WN warps;
    STAGES input rows loaded ahead; MATH tf32 (one product) or tf32x3."""

    template = "conv_rows_f32"
    anchors = frozenset({"convolution"})

    def __init__(self) -> None:
        super().__init__("conv_rows_f32", {
            "BM": (32, 64, 128), "BN": (64, 128), "WM": (1, 2, 4), "WN": (1, 2, 4), "NT": (4, 8, 16, 32),
            "STAGES": (1, 2, 3), "MATH": ("tf32", "tf32x3")})

    # The least shared memory a config takes (the last preset's): W's rows 32 at a time, 64 columns, one
    # stage ahead. Where even that does not fit, no config does.
    SMALLEST: ClassVar[dict[str, Any]] = dict(BM=32, BN=64, STAGES=1)

    def match(self, problem: Problem) -> ConvMatch | str:
        found = match_conv(problem)
        if isinstance(found, str):
            return found
        why = refusal(found)
        if why:
            return why
        if self.smem_bytes(self.SMALLEST, found) > SMEM_LIMIT:
            return (f"K = {found.c} x {found.taps} too large: W's rows for all of it do not fit in shared "
                    "memory beside the input rows, even 32 rows at a time")
        return found

    def leads(self, problem: Problem) -> bool:
        """Ahead of the implicit GEMM where one TF32 product is allowed, the kernel is wider than 1x1 (a 1x1
        is conv_pointwise_f32's) and W's rows fit 64 at a time: on level1/63 (K = 16 x 9) its first seed
        took 6.69 ms against the implicit GEMM's 9.58, beside cuDNN's TF32 at 6.5. Where K allows only 32
        rows (level1/55, 64 x 9) it took 22 ms against 3.2. With three products it has not been timed
        against the implicit GEMM."""
        f = self.match(problem)
        if isinstance(f, str) or f.taps == 1 or not tf32_allowed(problem.contract(), problem.ops):
            return False
        return any(c["BM"] >= 64 for c in self.seeds(problem))

    def reduced_precision(self, config: dict[str, Any], problem: Problem | None = None) -> bool:
        return config.get("MATH") == "tf32"

    @staticmethod
    def smem_bytes(c: dict[str, Any], f: ConvMatch) -> int:
        """W's BM rows of K (rounded up to 32, +4) and the ring's KH + STAGES input rows of every (padded)
        channel, BN + KW - 1 columns rounded up to 32, +8: the template's layout."""
        ldw = cdiv(k_padded(f), 32) * 32 + 4
        ldx = cdiv(c["BN"] + f.kernel[1] - 1, 32) * 32 + 8
        return (c["BM"] * ldw + (f.kernel[0] + c["STAGES"]) * cdiv(f.c, 8) * 8 * ldx) * 4

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        f = self.match(problem)
        if isinstance(f, str):
            return False
        # Three products: with 64 accumulators a thread and an epilogue the 128 x 128 tile held 255
        # registers and spilled (ptxas -v, sm_90a), so at most 32.
        return tf32_tiles_valid(c, problem, 32) and self.smem_bytes(c, f) <= SMEM_LIMIT

    # On level1/63 (16 -> 128 channels, 3x3, 1022 x 1022 outputs, one TF32 product; cuDNN's TF32 6.5 ms),
    # timed beside cuDNN: 64 x 128 by 2 x 4 warps over 32 rows 6.69 ms, 64 x 64 6.71, 128 x 128 7.44,
    # 128 x 64 8.14 (benchmarks/data/conv_rows_sweep_63.json). 64 x 128 by 2 x 2 warps took 6.49 but holds
    # 64 accumulators a thread and spilled with an epilogue (ptxas -v, sm_90a): not a seed.
    PRESETS: tuple[dict[str, Any], ...] = (
        dict(BM=64, BN=128, WM=2, WN=4, NT=32, STAGES=3),
        dict(BM=64, BN=64, WM=2, WN=2, NT=16, STAGES=2),
        dict(BM=128, BN=128, WM=2, WN=4, NT=16, STAGES=2),
        dict(BM=128, BN=64, WM=4, WN=2, NT=16, STAGES=2),
        dict(BM=32, BN=64, WM=1, WN=2, NT=8, STAGES=1),
    )

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        """The presets that fill the GPU first; one TF32 product first where the contract allows it."""
        f = self.matched(problem)
        maths = ("tf32", "tf32x3") if tf32_allowed(problem.contract(), problem.ops) else ("tf32x3",)
        out = [{**c, "MATH": m} for m in maths for c in self.PRESETS]
        out = [c for c in out if self.valid(c, problem)]

        def blocks(c: dict[str, Any]) -> int:
            h_out, w_out = f.out_spatial
            return cdiv(f.c_out, c["BM"]) * cdiv(w_out, c["BN"]) * cdiv(h_out, c["NT"]) * f.n

        return sorted(out, key=lambda c: (c["MATH"] != maths[0], not fills_gpu(blocks(c)), -min(blocks(c), SEED_SMS)))

    def extra(self, problem: Problem) -> dict[str, Any]:
        f = self.matched(problem)
        return {"CIN": f.c, "KH": f.kernel[0], "KW": f.kernel[1], "PH": f.padding[0], "PW": f.padding[1],
                "EPI": f.epilogue}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        f = self.matched(problem)
        h_out, w_out = f.out_spatial
        out_shape = (f.n, f.c_out, h_out, w_out)
        grid = (f"(cdiv(C_out, {c['BM']}) * cdiv(W_out, {c['BN']}) * cdiv(H_out, {c['NT']}), {f.n})")
        return LaunchSpec(entry=self.name, grid=grid, block=f"({c['WM'] * c['WN'] * 32},)",
                          shared_mem=str(self.smem_bytes(c, f)),
                          args=(f.x, f.w, "out0", "H", "W", "H_out", "W_out", "C_out", *f.epilogue.launch_args()),
                          outputs=((repr(out_shape), "float32"),),
                          bindings=(("H", f"{f.x}.shape[2]"), ("W", f"{f.x}.shape[3]"), ("H_out", str(h_out)),
                                    ("W_out", str(w_out)), ("C_out", f"{f.w}.shape[0]")))
