"""Grouped and depthwise convolutions, and those of few input channels (1-3 spatial dims, strided, padded,
dilated, transposed) computed directly: a grouped convolution's GEMMs are too thin for tensor-core tiles
(a depthwise one multiplies one input channel per output channel), and an image's 3 colour channels
leave the implicit GEMM's 32-channel k-tiles mostly padding, so each thread sums its outputs' taps over
the group's input channels with FFMA, reading the input through the caches. A thread computes OCT
output channels of one group (each input value loaded once for all of them) at PW neighbouring output
pixels along W; the traced elementwise chain runs on each value before its store. fp32, fp16 or bf16
tensors, summed in fp32 and stored in their dtype. With WIN (not
transposed), a block shares its OCT output channels, whose weights it keeps in shared memory, and each
input row segment under a thread's pixels and W taps is loaded once into registers and slid over."""

from __future__ import annotations

from typing import Any

from cuforge.kernels.base import SMEM_LIMIT, GraphFamily
from cuforge.kernels.chains import CTYPES
from cuforge.kernels.conv_match import FEW_CHANNELS, ConvMatch, direct_first, few_channels, match_conv
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec
from cuforge.kernels.registry import family


def match_direct(problem: Problem) -> ConvMatch | str:
    found = match_conv(problem, grouped=True, dtypes=tuple(CTYPES))
    if isinstance(found, str):
        return found
    if found.groups == 1 and not few_channels(found):
        return f"not a grouped convolution, and more than {FEW_CHANNELS} input channels (the implicit GEMM's case)"
    if found.pool:
        return "a convolution whose output pixels are pooled (the implicit GEMM's epilogue sums them)"
    if found.pixels * found.c_out >= 2**40:
        return "more outputs than the kernel's index math allows"
    return found


@family(250)
class ConvDirect(GraphFamily):
    """One thread per (image, OCT output channels, output row, PW pixels along W)."""

    anchors = frozenset({"convolution"})

    def __init__(self) -> None:
        super().__init__("conv_direct", {"BLOCK": (128, 256, 512), "OCT": (1, 2, 4, 8, 16), "PW": (1, 2, 4, 8), "WIN": (0, 1),
                                          "VW": (0, 1)})

    # VW (with WIN, 8 pixels a thread, stride 1 and no dilation along W): a row's 8 inputs under the pixels
    # and the 8 outputs move as 16-byte loads and stores where they lie aligned, where one element a load
    # and a store each was the rule (a depthwise convolution reads and writes little else).
    DEFAULTS = {"WIN": 0, "VW": 0}

    @staticmethod
    def weight_bytes(c: dict[str, Any], f: ConvMatch) -> int:
        """Shared memory of a WIN block: its OCT output channels' weights."""
        return c["OCT"] * (f.c // f.groups) * f.taps * 4

    def match(self, problem: Problem) -> ConvMatch | str:
        return match_direct(problem)

    def leads(self, problem: Problem) -> bool:
        f = self.match(problem)
        return not isinstance(f, str) and direct_first(f)

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        f = self.matched(problem)
        cog = f.c_out // f.groups
        if c.get("WIN", 0) and (f.transposed or self.weight_bytes(c, f) > SMEM_LIMIT):
            return False
        if c.get("VW", 0) and (not c.get("WIN", 0) or c["PW"] != 8 or f.stride[-1] != 1 or f.dilation[-1] != 1):
            return False
        return cog % c["OCT"] == 0 and (c["PW"] == 1 or not f.transposed)

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        f = self.matched(problem)
        cog = f.c_out // f.groups
        octs = [o for o in (4, 8, 2, 1) if cog % o == 0]
        pws = (1,) if f.transposed else (4, 2, 1)
        out = [dict(BLOCK=256, OCT=octs[0], PW=pws[0]), dict(BLOCK=128, OCT=octs[0], PW=pws[-1 if len(pws) == 1 else 1])]
        if len(octs) > 1:
            out.append(dict(BLOCK=256, OCT=octs[1], PW=pws[0]))
        # Not transposed: shared weights and slid rows first (H100, against the seeds above: level1/54
        # 2.32 -> 1.35 ms, 50 5.44 -> 2.48, the depthwise 82, 84, 85 1.3-2.6x faster), 32 accumulators a
        # thread: 16 channels x 2 pixels, then 8 x 4 (or the most channels a group allows x 4 pixels).
        if not f.transposed:
            wide = [o for o in (16, 8, 4, 2, 1) if cog % o == 0]
            win = [dict(BLOCK=256, OCT=o, PW=max(1, min(4, 32 // o)), WIN=1) for o in wide[:2]]
            if len(win) == 1:
                win.append({**win[0], "PW": 2})
            # 8 pixels a thread moved 16 bytes at a time (VW) lead where valid: on the H200, MobileNetV2's bf16 3x3
            # depthwise (144 channels, 56 x 56) 63 us with the first seed above, 37 us so.
            vw = [dict(BLOCK=256, OCT=o, PW=8, WIN=1, VW=1) for o in wide if o <= 4][:1]
            out = [c for c in vw + win if self.valid(c, problem)] + out
        return [c for i, c in enumerate(out) if c not in out[:i]]

    @staticmethod
    def geometry(f: ConvMatch) -> dict[str, tuple[int, int, int]]:
        """Every spatial quantity as (D, H, W), a lower-rank convolution's outer dims of size 1."""
        pad = 3 - f.dims

        def as3(t: tuple[int, ...], fill: int) -> tuple[int, int, int]:
            return (fill,) * pad + tuple(t)  # type: ignore[return-value]

        return {"IN": as3(f.spatial, 1), "OUT": as3(f.out_spatial, 1), "K": as3(f.kernel, 1), "S": as3(f.stride, 1),
                "P": as3(f.padding, 0), "DL": as3(f.dilation, 1)}

    def extra(self, problem: Problem) -> dict[str, Any]:
        f = self.matched(problem)
        return {"EPI": f.epilogue, "CTYPE": CTYPES[f.dtype], "C": f.c, "CO": f.c_out, "CG": f.c // f.groups, "COG": f.c_out // f.groups,
                "TRANSPOSED": int(f.transposed), **self.geometry(f)}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        f = self.matched(problem)
        out = self.geometry(f)["OUT"]
        pixels = f.n * out[0] * out[1] * -(-out[2] // c["PW"])
        if c.get("WIN", 0):  # a grid row per OCT output channels
            return LaunchSpec(entry=self.name, grid=f"(cdiv(items, {c['BLOCK']}), {f.c_out // c['OCT']})", block=f"({c['BLOCK']},)",
                              shared_mem=str(self.weight_bytes(c, f)), args=(f.x, f.w, "out0", "items", *f.epilogue.launch_args()),
                              outputs=((repr((f.n, f.c_out, *f.out_spatial)), f.dtype),), bindings=(("items", str(pixels)),))
        items = pixels * (f.c_out // c["OCT"])
        return LaunchSpec(entry=self.name, grid=f"(cdiv(items, {c['BLOCK']}),)", block=f"({c['BLOCK']},)",
                          args=(f.x, f.w, "out0", "items", *f.epilogue.launch_args()),
                          outputs=((repr((f.n, f.c_out, *f.out_spatial)), f.dtype),), bindings=(("items", str(items)),))
