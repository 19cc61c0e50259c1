"""Convolution as an implicit GEMM on the 3xTF32 wgmma core: rows are output pixels (a tile of them
in one image), columns output channels, K runs over the kernel's taps and the input channels. The
input is first split into channels-last TF32 big/small planes and the weight into [C_out][tap][C]
planes by the GEMM's preparing kernel; the main kernel loads each tap's input window by TMA (its
element strides are the convolution's stride, its zero fill past the edges the padding) and runs the
traced elementwise chain on each output value before the one store - or, where the forward ends in a
mean or sum over each image's pixels per channel (a global average pool), adds the chain's values up
per channel in the tile and once per tile into the [N, C_out] output, which it never writes whole. A
2-D or 3-D convolution of stride 1 may instead run over zero-padded planes whose rows are the output's width
plus the kernel's reach (FLAT): each tap is then one fixed offset from a pixel's flat index, so a tile is
128 consecutive indices and a small image wastes only its padded columns."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from cuforge.kernels.base import SEED_SMS, SMEM_LIMIT, GraphFamily, sm_count
from cuforge.kernels.chains import literal, per_16_bytes
from cuforge.kernels.conv_match import ConvMatch, direct_only, match_conv, pointwise
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec
from cuforge.sandbox.protocol.precision import contract, tf32_allowed
from cuforge.kernels.registry import family


_AXES = ("D", "H", "W")  # the names of the spatial dims, outermost first, for 3-D; 2-D uses H, W; 1-D W


def axes(dims: int) -> tuple[str, ...]:
    return _AXES[3 - dims:]


def direct_reads(f: ConvMatch) -> float:
    """How often the convolution reads each input value: taps per output pixel (of its phase, transposed)
    times output pixels over input pixels."""
    taps = f.taps / (math.prod(f.stride) if f.transposed else 1)
    return taps * math.prod(f.out_spatial) / math.prod(f.spatial)


def reads_x_directly(f: ConvMatch) -> bool:
    """Whether TMA can read x as it lies (DIRECT): rows of whole 16 bytes (TMA's global strides). Each box
    starts on a 16-byte boundary before the window and reads W densely, and the split skips the floats ahead
    of it and, for a stride S along W, takes every S-th (a box starting anywhere else stops the H100 with an
    illegal instruction, measured with a (1, 3) kernel; a box with an element stride along W hung)."""
    return f.spatial[-1] % 4 == 0


def macs_per_output(f: ConvMatch) -> float:
    """Multiply-adds per output value on average: input channels (a group's) times the taps that reach it
    (each tap reaches one of a transposed convolution's S phases per dim)."""
    return f.c // f.groups * f.taps / (math.prod(f.stride) if f.transposed else 1)


def raw_row(c: dict[str, Any], f: ConvMatch) -> int:
    """DIRECT: the floats of one box row, a whole number of 16 bytes: up to 3 before the window's first and
    the window of TW outputs, S apart along W (1 apart for a transposed convolution's phase; DENSE_W, TW
    outputs of all phases reach (TW - 1) / S + 2 inputs)."""
    if c.get("DENSE_W", 0):
        return ((c["TW"] - 1) // f.stride[-1] + 2 + 3 + 3) // 4 * 4
    step = 1 if f.transposed else f.stride[-1]
    return (step * (c["TW"] - 1) + 4 + 3) // 4 * 4


def per_value_epilogue(f: ConvMatch) -> bool:
    """Whether the fused epilogue does more per output value than a bias and an activation: a batch norm's
    parameters, or an operand read per value (a residual)."""
    return any(kind == "bn_ch" or not kind.endswith("ch") for _, kind in f.epilogue.tensors)


def led_by(fam: GraphFamily, seeds: list[dict[str, Any]], problem: Problem, knobs: tuple[str, ...]) -> list[dict[str, Any]]:
    """Each seed with `knobs` on (each where the config stays valid), in order, then the first seed as it
    was: the knobs lead and the search still times the config without them."""
    out: list[dict[str, Any]] = []
    for c in seeds:
        for knob in knobs:
            if fam.valid({**c, knob: 1}, problem):
                c = {**c, knob: 1}
        out.append(c)
    return [c for i, c in enumerate(out + seeds[:1]) if c not in out[:i]]


def flat_fits(f: ConvMatch) -> bool:
    """Whether FLAT can run it: 2-D or 3-D, stride 1 (each output's taps lie at fixed offsets in the padded
    plane), ungrouped, a plane's flat index (a TMA coordinate) within an int and the padding kernel's grid
    (an image's depths along z) within 65535."""
    return (f.dims in (2, 3) and set(f.stride) == {1} and f.groups == 1 and flat_padded(f, -2) * flat_padded(f, -1) < 2**31
            and f.n * (flat_padded(f, 0) if f.dims == 3 else 1) <= 65535)


def reads_nchw(f: ConvMatch) -> bool:
    """Whether a half kernel can read x as it lies (NCHW): a 2-D 1x1 convolution of stride 1 without
    padding, whose output pixel p is input pixel p, so a tile's 128 flat pixels are 128 consecutive
    elements of each channel's plane; a plane of whole 16 bytes (TMA's global strides)."""
    return pointwise(f) is None and f.dims == 2 and math.prod(f.spatial) % 8 == 0 and f.dtype != "float32"


def flat_padded(f: ConvMatch, axis: int) -> int:
    """FLAT: the padded planes' extent along a spatial axis, the output's plus the kernel's reach."""
    return f.out_spatial[axis] + f.dilation[axis] * (f.kernel[axis] - 1)


def flat_pitch(f: ConvMatch) -> int:
    """FLAT: the padded plane's row."""
    return flat_padded(f, -1)


def flat_lead(f: ConvMatch, axis: int) -> int:
    """FLAT: the zeros ahead of x's first element along a spatial axis in the padded planes; a transposed
    convolution's output o reaches x[o + P - k D], so its planes start D (K - 1) - P before x."""
    k, p, d = f.kernel[axis], f.padding[axis], f.dilation[axis]
    return d * (k - 1) - p if f.transposed else p



CONV_KNOBS = {"BN": (16, 32, 64, 128, 192), "TW": (8, 16, 32, 64, 128), "TH": (1, 2, 4, 8, 16), "STAGES": (2, 3, 4, 5),
              "GROUP_M": (1, 8, 16), "FOLD": (0, 1, 2), "PERSIST": (0, 1), "OVERLAP": (0, 1), "DIRECT": (0, 1),
              "DENSE_W": (0, 1), "FLAT": (0, 1), "PASSES": (3, 1), "EPI_RUNS": (0, 1),
              "XVEC": (0, 1)}

# EPI_RUNS: the floats a consumer warpgroup's staged channel holds, its 64 pixels and 4 of padding (the
# fragment's writes then meet 32 banks); the template's EPI_PITCH.
EPI_PITCH = 68


@family(240)
class ConvTf32x3Sm90(GraphFamily):
    """Implicit-GEMM convolution, sm_90a: tiles of 128 output pixels (TD x TH x TW of one image) by BN
    output channels; per k-tile, one tap and 32 input channels; the wgmma consumers, TMA producer and
    3xTF32 promotion of gemm_tf32x3_sm90. A transposed convolution of stride S is S^dims ordinary
    ones, one per output phase (o mod S), each over the taps that reach that phase: no zeros are
    multiplied."""

    anchors = frozenset({"convolution"})

    BM = 128
    BK = 32  # channels a k-tile: its rows are 128 bytes
    template = "conv_tf32_sm90"

    def __init__(self) -> None:
        super().__init__("conv_tf32x3_sm90", dict(CONV_KNOBS))

    def runs_on(self, compute_capability: str) -> bool:
        return compute_capability == "9.0"

    def reduced_precision(self, config: dict[str, Any], problem: Problem | None = None) -> bool:
        return config.get("PASSES", 3) == 1

    def match(self, problem: Problem) -> ConvMatch | str:
        found = match_conv(problem)
        if not isinstance(found, str) and direct_only(found):
            return f"a 3-D convolution of {found.c} -> {found.c_out} channels: conv_direct's case (faster there)"
        return found

    @staticmethod
    def tile(c: dict[str, Any], dims: int) -> tuple[int, int, int]:
        """(TD, TH, TW): the output pixels a block computes; a lower-rank conv has size-1 outer dims, and
        a 1-D (or FLAT) tile is 128 in a row (loaded as 128 / TW boxes of TW)."""
        if dims == 1 or c.get("FLAT", 0):
            return 1, 1, 128
        tw, th = c["TW"], c["TH"] if dims >= 2 else 1
        return (128 // (tw * th) if dims == 3 else 1), th, tw

    @staticmethod
    def folded_taps(c: dict[str, Any], f: ConvMatch) -> int:
        """The taps that share one channel vector (FOLD innermost kernel dims)."""
        return math.prod(f.kernel[len(f.kernel) - c.get("FOLD", 0):])

    @classmethod
    def planes(cls, c: dict[str, Any]) -> int:
        """The operand tiles a stage holds per operand: TF32 big and small, or big only (one product)."""
        return 2 if c.get("PASSES", 3) == 3 else 1

    @classmethod
    def smem_bytes(cls, c: dict[str, Any], dims: int = 2, row: int = 0) -> int:
        """The dynamic shared memory: the stages, alignment slack and the barriers; DIRECT, a stage holds the
        weight's tiles and the raw input boxes (rows of `row` floats), the split tiles lie past the ring."""
        planes = cls.planes(c)
        if not c.get("DIRECT", 0):
            ring, split = c["STAGES"] * planes * (cls.BM + c["BN"]) * 128, 0
        else:
            td, th, tw = cls.tile(c, dims)
            raw = -(-(tw // c["TW"]) * cls.BK * td * th * row * 4 // 1024) * 1024
            ring, split = c["STAGES"] * (planes * c["BN"] * cls.BK * 4 + raw), 2 * cls.BM * cls.BK * 4
        # EPI_RUNS: both consumers' staged tiles, in the ring where a block has one tile and the ring holds
        # them (the template's EPI_IN_RING), else past the barriers
        staged = 2 * c["BN"] * EPI_PITCH * 4 if c.get("EPI_RUNS", 0) else 0
        if staged and not c.get("PERSIST", 0) and ring >= staged:
            staged = 0
        return ring + split + 1024 + 16 * c["STAGES"] + staged

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        f = self.match(problem)
        if isinstance(f, str):
            return False
        td, th, tw = self.tile(c, f.dims)
        if td * th * tw != self.BM or ((f.dims < 2 or c.get("FLAT", 0)) and (c["TH"] != 1 or c["TW"] < 32)):
            return False
        if c.get("FLAT", 0) and (not flat_fits(f) or c.get("FOLD", 0)):
            return False
        if c.get("EPI_RUNS", 0) and f.pool:  # a pooled tile's sums never reach the output one by one
            return False
        if c.get("XVEC", 0) and (c.get("FOLD", 0) or c.get("DIRECT", 0) or c.get("NCHW", 0)):  # x's plain or padded planes only
            return False
        if c.get("NCHW", 0) and not (reads_nchw(f) and c.get("FLAT", 0)):  # x as it lies: a 1x1's flat tiles
            return False
        if self.reduced_precision(c) and not tf32_allowed(problem.contract(), problem.ops):
            return False  # one TF32 product: only where the contract lets the output carry TF32's rounding
        if c.get("FOLD", 0) > min(f.dims, 2) or (c.get("FOLD", 0) and f.transposed):
            return False
        # A tile's epilogue beside the next tile's first wgmmas: only where a block walks tiles, and with both
        # tiles' accumulators in registers only 64-channel tiles compile without spills (ptxas -v, sm_90a).
        if c.get("OVERLAP", 0) and (not c.get("PERSIST", 0) or c["BN"] > 64):
            return False
        if c.get("DIRECT", 0) and (c.get("FOLD", 0) or c.get("FLAT", 0) or not reads_x_directly(f) or raw_row(c, f) > 256):
            return False
        if c.get("DENSE_W", 0) and (not f.transposed or f.stride[-1] == 1 or not c.get("DIRECT", 0) or c["TW"] != tw):
            return False
        box = dict(zip(("D", "H", "W"), (td, th, c["TW"])))
        if any(box[a] * s > 256 for a, s in zip(axes(f.dims), self.box_strides(f))):  # TMA boxes span <= 256 elements
            return False
        return self.smem_bytes(c, f.dims, raw_row(c, f)) + (4 * c["BN"] if f.pool else 0) <= SMEM_LIMIT  # + a pooled tile's sums

    @staticmethod
    def box_strides(f: ConvMatch) -> tuple[int, ...]:
        """The input elements between neighbouring output pixels of a tile (a transposed
        convolution's phase reads its input densely)."""
        return (1,) * f.dims if f.transposed else f.stride

    @staticmethod
    def tile_extent(f: ConvMatch) -> tuple[int, ...]:
        """The output pixels a phase covers per dim: all of them, or every S-th when transposed."""
        return tuple(-(-o // s) for o, s in zip(f.out_spatial, f.stride)) if f.transposed else f.out_spatial

    def covered_share(self, c: dict[str, Any], f: ConvMatch) -> float:
        """The share of a config's tiles' pixels that are output pixels: the last tile along each dim is
        partly past the edge (a 128-wide tile on W = 260 computes 384 pixels a row for 260); FLAT, the
        padded columns and the last tile's end are computed too."""
        if c.get("FLAT", 0):
            oh, ow = f.out_spatial[-2:]
            return oh * ow / (-(-oh * flat_pitch(f) // self.BM) * self.BM)
        share = 1.0
        for extent, size in zip(self.tile_extent(f), self.tile(c, f.dims)[3 - f.dims:]):
            share *= extent / (-(-extent // size) * size)
        return share

    def tile_shapes(self, f: ConvMatch, widest: int) -> list[tuple[int, int]]:
        """(TW, TH) of the seeds' tiles in order of preference: `widest` (the output's width, at most 128),
        32, 16, then 128; a 1-D tile is one row of 128. The first whose tiles cover the output within 5% of
        the best leads. On the H100 (the first two seeds before and after): level1/69's 128-wide
        tiles (68% of their pixels are output) 7.12 ms, 32 x 4 (89%) 5.36 ms; level1/58 1.57x, 68 1.24x, 61 1.17x,
        77 1.17x, level2/93 1.40x, no file of the twelve it reorders slower (nor, searched again, the six level2
        pipelines whose convolution stage it reaches)."""
        shapes = [(tw, 1 if f.dims == 1 else min(128 // tw, 16) if f.dims == 2 else min(max(1, 128 // tw // 2), 16))
                  for tw in dict.fromkeys((widest, 32, 16, 128))]
        share = [self.covered_share({"TW": tw, "TH": th}, f) for tw, th in shapes]
        lead = next(i for i, s in enumerate(share) if s >= 0.95 * max(share))
        return [shapes[lead]] + shapes[:lead] + shapes[lead + 1:]

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        f = self.matched(problem)
        out_w = self.tile_extent(f)[-1]
        tws = [t for t in self.knobs["TW"] if t >= min(out_w, 128)] or [128]
        if f.dims == 1:  # the widest box the stride allows
            tws = [max(t for t in self.knobs["TW"] if t * self.box_strides(f)[0] <= 256 or t == 8)]
        # Few input channels: fold the innermost kernel dims into the channel vector, so that a
        # k-tile's 32 channels are mostly real ones.
        fold = 0 if f.transposed or f.c >= 32 else min(f.dims, 2) if f.c * math.prod(f.kernel[-2:]) <= 64 else 1
        bns = [b for b in self.knobs["BN"] if b >= min(f.c_out, 128)] or [128]
        out = []
        shapes = 0
        for tw, th in self.tile_shapes(f, tws[0]):
            found = False
            for bn in dict.fromkeys((bns[0], 64)):
                c = {"BN": bn, "TW": tw, "TH": th, "GROUP_M": 8, "FOLD": fold}
                stages = [s for s in self.knobs["STAGES"] if self.valid({**c, "STAGES": s}, problem)]
                if stages:
                    out.append({**c, "STAGES": max(stages)})
                    found = True
            shapes += found
            if shapes == 3:
                break
        # Few output tiles: narrower columns first, so that more blocks share the work.
        if out and len(out) > 1 and f.pixels // self.BM * -(-f.c_out // out[0]["BN"]) < SEED_SMS:
            out.sort(key=lambda c: c["BN"])
        if fold and out:  # the folded kernel leads (1.1x to 5x faster on the H100); unfolded second
            out.insert(1, {**out[0], "FOLD": 0})
        # The persistent grid (a block per SM; the next tile's loads overlap this one's epilogue): on the H100
        # (H100) 1.10-1.13x where the output is pooled (level2/67, 44) and 1.08x on level1/87, but 0.96x and
        # 0.90x where a larger output is written (level2/19, 65): it leads for a pooled output, else comes third.
        # A tile's epilogue beside the next tile's first wgmmas (OVERLAP), A/B on the H100: 1.035x on
        # level2/67 (pooled, GELU), 0.96x on level1/54: with the pooled persistent seed only.
        if out:
            persist = {**out[0], "PERSIST": 1}
            if f.pool and self.valid({**persist, "OVERLAP": 1}, problem):
                persist["OVERLAP"] = 1
            out.insert(0 if f.pool else min(2, len(out)), persist)
        # x read as it lies (DIRECT: no planes of twice the input written and read again), A/B on the H100
        # (H100): where each input value is read for few outputs (taps x output / input pixels) it wins,
        # level1/87 (1) 1.58x, 64 and 67 (3) 1.27x and 1.22x; at 9 it is even (level1/55, 57: 1.00x, 1.06x;
        # level2/16 0.94x), at 29 it loses (level1/70 0.87x): the second seed up to 5, else the last.
        # A strided W widens the box's rows (S floats an output): the widest TW whose rows fit TMA's 256 (a 2-D
        # tile keeps its 128 pixels by growing TH, a 3-D one by growing TD), with the most stages that fit.
        narrower = ({**out[0], "DIRECT": 1, "TW": tw, "TH": 128 // tw if f.dims == 2 else out[0]["TH"], "STAGES": st}
                    for tw in sorted(self.knobs["TW"], reverse=True) if tw <= out[0]["TW"]
                    for st in sorted(self.knobs["STAGES"], reverse=True)) if out else ()
        direct = next((d for d in narrower if self.valid(d, problem)), None)
        if direct:
            if direct_reads(f) <= 5:
                out.insert(1, direct)
            else:
                out.append(direct)
        # Tiles spanning W's phases (DENSE_W), A/B against DIRECT on the H100: where an output value
        # takes few multiply-adds (macs_per_output) the phase tiles' scattered stores bound the kernel, level1/81
        # (11.5) 1.63x, 79 (48) 1.03x; with more, the S-fold MACs lose: level1/73, 77 (108) 0.74x, 0.64x, level2/16,
        # 5, 93 (144) 0.81-0.91x. Seeded second where at most 64.
        if direct and macs_per_output(f) <= 64 and self.valid({**direct, "DENSE_W": 1}, problem):
            out.insert(1, {**direct, "DENSE_W": 1})
        # Flat tiles over padded planes (FLAT) lead where they cover the output 5% better than the first seed's.
        # On the H100 (against that seed side by side): level2/11 (34 x 34 outputs, 82% covered against
        # 60%) 4.50 -> 3.19 ms as a pipeline, level1/69 (98% against 89%) 5.36 -> 4.96, level2/19 (99% against 93%)
        # 14.8 -> 13.6 ms, though the padded planes are larger than x (1.41x for level2/11's 32 x 32 images); 3-D (a tile
        # of one depth): level1/61 8.54 -> 7.56 ms, 68 23.3 -> 19.6, 70 23.0 -> 18.8, level2/61 4.23 -> 2.91, 77 11.2 -> 8.27.
        flats = ({**out[0], "FLAT": 1, "TW": 128, "TH": 1, "FOLD": 0, "STAGES": st} for st in sorted(self.knobs["STAGES"], reverse=True)) if out else ()
        flat = next((c for c in flats if self.valid(c, problem)), None)
        if flat and self.covered_share(flat, f) > 1.05 * self.covered_share(out[0], f):
            out.insert(0, flat)
        out = self.with_epilogue_knobs(out, problem)
        # Where the contract allows TF32 (a convolution under PyTorch's default flags, whose cuDNN runs
        # TF32), one product per k-tile instead of three: the same seeds, one TF32 pass each, first.
        # cuDNN picks TF32 per shape, and keeps few input channels in fp32: on the H200, level1/54, 59, 60
        # and 66 (3 channels, 3-D) time the same with TF32 on and off, and a TF32 kernel for them or for a
        # 3-channel 2-D convolution is judged a downgrade, while 16 to 64 channels (level1/55, 56, 62, 63,
        # 80, 87; a 16-channel 3-D one) pass. Not seeded below 16 channels; where a guess is wrong the
        # search stops proposing them (TemplateProposer.learn). Half the shared memory a stage: the most
        # stages that fit. Not under KernelBench's rule either: its 1e-4 tolerance against cuDNN's own TF32
        # result leaves no room for another TF32 summation.
        if out and f.c >= 16 and contract(problem.contract()).fixed_tolerance is None and self.valid({**out[0], "PASSES": 1}, problem):
            ones = []
            for c in out:
                fits = [s for s in self.knobs["STAGES"] if self.valid({**c, "PASSES": 1, "STAGES": s}, problem)]
                ones.append({**c, "PASSES": 1, "STAGES": max(fits)})
            out = ones + out
        return out

    def with_epilogue_knobs(self, seeds: list[dict[str, Any]], problem: Problem) -> list[dict[str, Any]]:
        """The seeds with the epilogue by runs (EPI_RUNS: a thread's 8 pixels of one channel share their
        position, the channel's parameters and a 16-byte store): each of them led by it where the epilogue
        does per-value work (a batch norm's parameters, an operand per output value), else its first seed
        with it last. On the H200, three TF32 products, beside the same configs without it: the fp32 ResNet
        bottleneck 432 -> 302 us, MobileNetV2's inverted residual 383 -> 284 us; with one TF32 product and no
        epilogue it loses (level1/63 14.2 -> 18.7 ms, 87 7.7 -> 8.7 ms): an fp32 fragment's stores already
        fill whole sectors, so only the instructions an epilogue value costs are saved."""
        if not seeds:
            return seeds
        if per_value_epilogue(self.matched(problem)):
            return led_by(self, seeds, problem, ("EPI_RUNS",))
        runs = {**seeds[0], "EPI_RUNS": 1}
        return seeds + [runs] if self.valid(runs, problem) else seeds

    def extra(self, problem: Problem) -> dict[str, Any]:
        f = self.matched(problem)
        pad = (1,) * (3 - f.dims)
        return {"EPI": f.epilogue, "HALF": 0, "BK": self.BK, "DIMS": f.dims, "KERNEL": pad + f.kernel, "STRIDE": pad + f.stride,
                "PADDING": (0,) * (3 - f.dims) + f.padding, "DILATION": pad + f.dilation, "TRANSPOSED": int(f.transposed),
                "POOL": bool(f.pool), "POOL_SCALE": literal(f.pool), "FLAT_WP": flat_pitch(f) if flat_fits(f) else 0,
                "EPI_PITCH": EPI_PITCH}

    DEFAULTS: ClassVar[dict[str, Any]] = {"FOLD": 0, "PERSIST": 0, "OVERLAP": 0, "DIRECT": 0, "DENSE_W": 0, "FLAT": 0, "PASSES": 3,
                                          "EPI_RUNS": 0, "XVEC": 0}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        f = self.matched(problem)
        names = axes(f.dims)
        td, th, tw = self.tile(c, f.dims)
        box = dict(zip(("D", "H", "W"), (td, th, tw)))
        fold, folded = c.get("FOLD", 0), self.folded_taps(c, f)
        # CP: the elements of one pixel's channel vector (the folded taps' channels), 16-byte rows for TMA.
        align = per_16_bytes(f.dtype)
        bindings = [("NB", f"{f.x}.shape[0]"), ("C", f"{f.x}.shape[1]"), ("CP", f"({folded} * C + {align - 1}) // {align} * {align}"),
                    ("CO", f"{f.w}.shape[{1 if f.transposed else 0}]")] + ([sm_count(f.x)] if c.get("PERSIST") else [])
        for i, (a, k, s, p, d) in enumerate(zip(names, f.kernel, f.stride, f.padding, f.dilation)):
            size = (f"(I{a} - 1) * {s} - {2 * p} + {d * (k - 1)} + {f.output_padding[i]} + 1" if f.transposed
                    else f"(I{a} + {2 * p} - {d * (k - 1)} - 1) // {s} + 1")
            bindings += [(f"I{a}", f"{f.x}.shape[{2 + i}]"), (f"O{a}", size),
                         (f"X{a}", f"I{a} + {p}" if i >= f.dims - fold else f"I{a}")]  # folded planes start at -P
        spatial_in = " * ".join(f"I{a}" for a in names)
        out_dims = ", ".join(f"O{a}" for a in names)
        # TMA boxes list dims innermost first: channels, then W, H, D, then the image.
        steps = self.box_strides(f)
        box["W"] = c["TW"]  # a 1-D tile's box is TW of its 128
        x_box = (str(self.BK),) + tuple(f"{box[a] * s}" for a, s in reversed(list(zip(names, steps)))) + ("1",)
        x_strides = ("1",) + tuple(str(s) for s in reversed(steps)) + ("1",)
        split = f"{self.name}_split"
        # A phase of a transposed convolution covers every S-th output pixel; there are S^dims phases.
        span = dict(zip(("D", "H", "W"), (td, th, tw)))
        # DENSE_W: W's tiles span every phase.
        tiles = " * ".join(f"cdiv(cdiv(O{a}, {s}), {span[a]}) * {s}" if f.transposed and not (a == "W" and c.get("DENSE_W", 0))
                           else f"cdiv(O{a}, {span[a]})" for a, s in zip(names, f.stride))
        outs = tuple(f"O{a}" if a in names else "1" for a in _AXES)
        # The weight as [C_out][tap][C] planes: from [C_out][C][taps] per output channel, or, transposed,
        # from [C][C_out * taps] as one matrix.
        w_pre = ((split, f"(cdiv(CP, 32), cdiv(CO * {f.taps}, 32), 1)", "(32, 8)", f"({f.w}, scratch1, CO * {f.taps}, C, CP, 1)")
                 if f.transposed else
                 (split, f"(cdiv(CP, 32), cdiv({f.taps}, 32), CO)", "(32, 8)", f"({f.w}, scratch1, {f.taps}, C, CP, 1)"))
        x_pre = (split, f"(cdiv(CP, 32), cdiv({spatial_in}, 32), NB)", "(32, 8)", f"({f.x}, scratch0, {spatial_in}, C, CP, 1)")
        if c.get("XVEC", 0):  # the same planes 16 bytes a thread access: images of ID depths, rows of IW
            ids, ihs = ("ID" if f.dims == 3 else "1"), ("IH" if f.dims >= 2 else "1")
            x_pre = (f"{self.name}_pad_xv", f"(cdiv({ihs} * IW, 64), cdiv(CP, 64), NB * {ids})", "(256,)",
                     f"({f.x}, scratch0, C, CP, {ids}, {ihs}, IW, {ids}, {ihs}, 0, 0, 0, IW)")
        outer = f.taps // folded
        if fold:
            ext = {a: (f"I{a}", f"X{a}") if a in names else ("1", "1") for a in _AXES}
            x_pre = (f"{self.name}_fold_x", f"(min(cdiv(NB * {' * '.join(f'X{a}' for a in names)} * CP, 256), 1 << 20),)", "(256,)",
                     f"({f.x}, scratch0, NB, C, CP, {', '.join(ext[a][0] for a in _AXES)}, {', '.join(ext[a][1] for a in _AXES)})")
            w_pre = (f"{self.name}_fold_w", f"(min(cdiv(CO * {outer} * CP, 256), 1 << 20),)", "(256,)", f"({f.w}, scratch1, CO, C, CP)")
        x_map = f"tma_nd(scratch0, ({', '.join(x_box)}), ({', '.join(x_strides)}))"
        x_planes = f"(2 * NB, {', '.join(f'X{a}' for a in names)}, CP)"
        if c.get("FLAT", 0):  # padded planes [2 * NB][DP][HP * WP][CP] (2-D: no DP), a box TW pixels of one
            hp, wp = flat_padded(f, -2), flat_padded(f, -1)
            dp, ld, depth = (flat_padded(f, 0), flat_lead(f, 0), "ID") if f.dims == 3 else (1, 0, "1")
            pad_args = f"{f.x}, scratch0, C, CP, {depth}, IH, IW, {dp}, {hp}, {ld}, {flat_lead(f, -2)}, {flat_lead(f, -1)}"
            x_pre = ((f"{self.name}_pad_xv", f"(cdiv({hp * wp}, 64), cdiv(CP, 64), NB * {dp})", "(256,)", f"({pad_args}, {wp})")
                     if c.get("XVEC", 0) else (f"{self.name}_pad_x", f"(cdiv({hp * wp}, 32), cdiv(CP, 32), NB * {dp})", "(32, 8)", f"({pad_args})"))
            x_map = f"tma_nd(scratch0, ({self.BK}, {c['TW']}, 1{', 1' if f.dims == 3 else ''}))"
            x_planes = f"(2 * NB, {f'{dp}, ' if f.dims == 3 else ''}{hp * wp}, CP)"
            tiles = f"{'OD * ' if f.dims == 3 else ''}cdiv(OH * {wp}, {self.BM})"
        pre = (x_pre, w_pre)
        if c.get("NCHW", 0):  # x itself as [NB][C][IH * IW]: boxes of 64 flat pixels by BK channels
            x_map = f"tma_nd({f.x}, (64, {self.BK}, 1), view=(NB, C, -1))"
            x_planes, pre = "(1,)", (w_pre,)
        if c.get("DIRECT"):  # x itself, innermost first: W (densely), H, D, its channels, the image; unswizzled
            x_map = (f"tma_nd({f.x}, ({', '.join((str(raw_row(c, f)),) + x_box[2:-1])}, 32, 1), "
                     f"({', '.join(('1',) + x_strides[2:-1])}, 1, 1), 0)")
            x_planes, pre = "(1,)", (w_pre,)
        blocks = f"NB * {tiles} * cdiv(CO, {c['BN']})"  # one a tile; persistent, one an SM
        out_shape = repr(f.pooled_shape) if f.pool else f"(NB, CO, {out_dims})"
        return LaunchSpec(
            entry=self.name, grid=f"(min({blocks}, SMS),)" if c.get("PERSIST") else f"({blocks},)", block="(384,)",
            shared_mem=str(self.smem_bytes(c, f.dims, raw_row(c, f))),
            bindings=tuple(bindings),
            scratch=((x_planes, f.dtype, "empty"), (f"(2 * CO, {outer}, CP)", f.dtype, "empty")),
            pre=pre,
            args=(x_map, f"tma_nd(scratch1, ({self.BK}, 1, {c['BN']}))",
                  "out0", "NB", "CO", "CP", *outs, *f.epilogue.launch_args()),
            outputs=((out_shape, f.dtype, "zeros") if f.pool else (out_shape, f.dtype),))
