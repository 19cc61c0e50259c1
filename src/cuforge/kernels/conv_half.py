"""Implicit-GEMM convolution in fp16 and bf16 on Hopper: conv_tf32x3_sm90's kernel (tiles of output
pixels by output channels, taps by TMA windows, the traced chain fused before one store) with fp16/bf16
wgmma instead of TF32. The input and weight planes hold the elements as they are, a k-tile is 64
channels (128-byte rows, as the TF32 kernel's 32), sums are fp32 and the output is rounded once to the
input's dtype: what cuDNN computes for a half convolution, so no precision contract is needed."""

from __future__ import annotations

from typing import Any, ClassVar

from cuforge.kernels.base import GraphFamily
from cuforge.kernels.conv import CONV_KNOBS, ConvTf32x3Sm90, led_by
from cuforge.kernels.conv_match import ConvMatch, direct_only, match_conv
from cuforge.kernels.gemm import HALF_ELEMENTS
from cuforge.kernels.registry import family
from cuforge.problems.problem import Problem

# The TF32 kernel's knobs a half one has no use for: one product (no split), and x read as it lies
# (DIRECT, DENSE_W), whose in-kernel split is fp32's.
_FP32_ONLY = ("PASSES", "DIRECT", "DENSE_W")


@family(245)
class ConvHalfSm90(ConvTf32x3Sm90):
    """conv_tf32x3_sm90's tiles, stages, grouping, folding, persistent grid and flat planes over fp16/bf16."""

    BK = 64

    def __init__(self) -> None:  # the TF32 family's knobs less its fp32-only ones, under this family's name
        knobs = {k: v for k, v in CONV_KNOBS.items() if k not in _FP32_ONLY}
        GraphFamily.__init__(self, "conv_half_sm90", {**knobs, "NCHW": (0, 1)})

    # NCHW: a 1x1 convolution reads x as it lies (no channels-last planes written and read again); see
    # conv.reads_nchw and the template.
    DEFAULTS: ClassVar[dict[str, Any]] = {"FOLD": 0, "PERSIST": 0, "OVERLAP": 0, "FLAT": 0, "EPI_RUNS": 0, "XVEC": 0, "NCHW": 0}

    @classmethod
    def planes(cls, c: dict[str, Any]) -> int:
        return 1

    def reduced_precision(self, config: dict[str, Any], problem: Problem | None = None) -> bool:
        return False  # fp16/bf16 products summed in fp32: the dtype's own accuracy, as cuDNN computes it

    def match(self, problem: Problem) -> ConvMatch | str:
        found = match_conv(problem, dtypes=tuple(HALF_ELEMENTS))
        if isinstance(found, str):
            return found
        if found.pool:
            return "a half-precision convolution summed over its pixels: its sums are fp32 atomics (not in this family)"
        if direct_only(found):
            return f"a 3-D convolution of {found.c} -> {found.c_out} channels: conv_direct's case (faster there)"
        return found

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        if c.get("DIRECT", 0) or c.get("DENSE_W", 0):
            return False
        return super().valid(c, problem)

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        """The TF32 family's seeds that a half kernel can run, in its order: those reading x as it lies and
        the one-product copies dropped (every half config is one product)."""
        out: list[dict[str, Any]] = []
        for c in super().seeds(problem):
            if not any(k in c for k in _FP32_ONLY) and c not in out:
                out.append(c)
        # x read as it lies by a 1x1 convolution (NCHW): the first seed's channel tile and epilogue over flat
        # tiles, with the most stages that fit, first. No channels-last copy of x is written and read again:
        # on the H200 (bf16, benchmarks/data/convs, beside every other seed) ResNet's 64 -> 64 1x1 took 28
        # us against the best other's 44, its 64 -> 256 with the residual 66 against 73, MobileNetV2's
        # 24 -> 144 61 against 76 and its 144 -> 24 41 against 62.
        if out:
            keep = {k: v for k, v in out[0].items() if k in ("BN", "GROUP_M", "EPI_RUNS")}
            nchw = {**keep, "TW": 128, "TH": 1, "FOLD": 0, "FLAT": 1, "NCHW": 1}
            fits = [st for st in self.knobs["STAGES"] if self.valid({**nchw, "STAGES": st}, problem)]
            if fits:
                out.insert(0, {**nchw, "STAGES": max(fits)})
        return out

    def with_epilogue_knobs(self, seeds: list[dict[str, Any]], problem: Problem) -> list[dict[str, Any]]:
        """Every seed led by the epilogue by runs and x laid out 16 bytes an access, each where valid; the
        first seed without them last. A half fragment's store of 8 pixels fills half a sector, a run's
        16-byte store a whole one. On the H200, bf16 (benchmarks/data/convs, beside the same config without
        the knob): EPI_RUNS takes ResNet's 64 -> 256 1x1 with its residual from 194 to 79 us, MobileNetV2's
        24 -> 144 from 141 to 75 us, the 3x3 and 144 -> 24 ones 10-16% down, one 64-channel 1x1 tile of 128
        pixels 51 -> 61 us (the only loss of ten); XVEC takes the 1x1 over 64 channels 72 -> 52 us and 144
        channels 101 -> 81 us, no loss of five."""
        return led_by(self, seeds, problem, ("EPI_RUNS", "XVEC"))

    def extra(self, problem: Problem) -> dict[str, Any]:
        f = self.matched(problem)
        return {**super().extra(problem), "HALF": 1, "ELEM": HALF_ELEMENTS[f.dtype], "PASSES": 1, "DIRECT": 0, "DENSE_W": 0}
