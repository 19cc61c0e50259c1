"""A traced graph as a convolution (dense, grouped or transposed, 1-3 spatial dims) with the elementwise
epilogue after it, or a pooling of that epilogue's values over each image's pixels: what the convolution
families (conv_tf32x3_sm90, conv_half_sm90, conv_direct) match, and which of them a shape suits."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cuforge.kernels.chains import DTYPE_NAMES, Epilogue, compile_chain, constant_scale
from cuforge.kernels.leaves import leaf_spec
from cuforge.op_graph import OpNode, constant_dims, is_ref
from cuforge.problems.problem import Problem


@dataclass(frozen=True)
class ConvMatch:
    """out = epilogue(conv(x, w) + bias): x [N, C, *spatial], w [C_out, C, *kernel] (transposed:
    [C, C_out, *kernel]); grouped: w [C_out, C / groups, *kernel] (transposed: [C, C_out / groups,
    *kernel]). The geometry lists one entry per spatial dim, outermost first."""

    x: str
    w: str
    n: int
    c: int
    c_out: int
    spatial: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    out_spatial: tuple[int, ...]
    epilogue: Epilogue
    transposed: bool = False
    output_padding: tuple[int, ...] = ()
    groups: int = 1
    # Nonzero: the output is the epilogue's values summed over each (image, channel)'s pixels times this
    # (1 / pixels for a mean, with any constant factor after it), of shape `pooled_shape`.
    pool: float = 0.0
    pooled_shape: tuple[int, ...] = ()
    dtype: str = "float32"  # the input's, the weight's and the output's

    @property
    def dims(self) -> int:
        return len(self.spatial)

    @property
    def taps(self) -> int:
        return math.prod(self.kernel)

    @property
    def pixels(self) -> int:
        return self.n * math.prod(self.out_spatial)


def _ints(value: Any, dims: int) -> tuple[int, ...] | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,) * dims
    if isinstance(value, (tuple, list)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(value) if len(value) == dims else tuple(value) * dims if len(value) == 1 else None
    return None


# At most this many input channels, an ungrouped convolution is also conv_direct's: 3 colour channels
# leave the implicit GEMM's 32-channel k-tiles mostly padding. Measured on the H100:
# 3-D ones of 3 or 8 channels to 16 or 24 were 1.7x to 4.2x faster direct than folded; a 2-D
# one of 8 to 64, 1.35x slower; with 64 output channels the implicit GEMM's tiles are full (it leads there).
FEW_CHANNELS = 8
FEW_OUT_CHANNELS = 32


def few_channels(f: ConvMatch) -> bool:
    return f.groups == 1 and f.c <= FEW_CHANNELS


def direct_first(f: ConvMatch) -> bool:
    """Where conv_direct leads the implicit GEMM: few input channels, not transposed, not pooled (the
    implicit GEMM's epilogue sums pooled outputs). Measured on the H100:
    with its weights in shared memory and input rows slid over in registers (WIN), conv_direct beat the
    implicit GEMM's best on every such KernelBench convolution, 2-D and 3-D, 3 or 8 channels into 64 or
    96 (level1/50, 54, 59, 60, 66: 1.1x to 4x; level2/57, 69, 71, 87, 90: 1.1x to 2x)."""
    return few_channels(f) and not f.transposed and not f.pool


def direct_only(f: ConvMatch) -> bool:
    """Where conv_direct alone is offered: a 3-D convolution of few input and output channels."""
    return few_channels(f) and f.dims == 3 and not f.transposed and f.c_out <= FEW_OUT_CHANNELS


# Ops after a pooling that leave its [N, C_out] values in place (size-1 dims added or dropped).
POOLED_VIEWS = ("squeeze", "unsqueeze", "view", "reshape", "_unsafe_view", "flatten")


def spatial_pool(nodes: tuple[OpNode, ...], anchor: str, full: tuple[int, ...]) -> tuple[int, float] | str | None:
    """Where the ops after a convolution (output `full`: [N, C, *spatial]) reach a sum or mean of the chain's
    value over every spatial dim: (its index in `nodes`, the factor its sum is scaled by), or why what
    follows it cannot be folded in (only constant scales and views may follow); None without one."""
    ndim, at, prev = len(full), None, anchor
    for k, node in enumerate(nodes):
        reads_chain = bool(node.args) and node.args[0] == prev
        if reads_chain and (node.op == "sum_lastdim" and ndim == 3 or node.op in ("sum", "mean") and len(node.args) > 1
                            and constant_dims(node.args[1], ndim) == tuple(range(2, ndim)) and node.kwarg("dtype") is None):
            at = k
            break
        prev = node.out
    if at is None or ndim < 3:
        return None
    pool = nodes[at]
    scale = 1.0 / math.prod(full[2:]) if pool.op == "mean" else 1.0
    prev = pool.out
    for node in nodes[at + 1:]:
        if not node.args or node.args[0] != prev:
            return f"{node.op} after the pooling reads something other than the pooled values"
        if node.op not in POOLED_VIEWS:
            factor = constant_scale(node, prev)
            if factor is None:
                return f"{node.op} after the pooling is not a scale by a constant or a view"
            scale *= factor
        elif [d for d in node.shape if d != 1] != [d for d in full[:2] if d != 1]:
            return f"{node.op} after the pooling reshapes it to {list(node.shape)}"
        prev = node.out
    return at, scale


def match_conv(problem: Problem, grouped: bool = False, dtypes: tuple[str, ...] = ("float32",)) -> ConvMatch | str:
    """The problem as a convolution with an elementwise epilogue, or why it is not one; a grouped
    one only when `grouped`; its input, weight, bias and chain operands all of one of `dtypes`."""
    if not problem.graph:
        return "no traced graph"
    first = problem.graph[0]
    if first.op != "convolution":
        return "does not start with a convolution"
    x, w, bias, stride, padding, dilation, transposed, output_padding, groups = (tuple(first.args) + (None,) * 9)[:9]
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        return f"a convolution with groups={groups!r}"
    if groups != 1 and not grouped:
        return f"a grouped convolution (groups={groups})"
    sx = leaf_spec(problem, x) if is_ref(x) else None
    sw = leaf_spec(problem, w) if is_ref(w) else None
    if sx is None or sw is None or sx.dtype not in dtypes or sw.dtype != sx.dtype:
        return f"the convolution's input and weight are not {'/'.join(DTYPE_NAMES[d] for d in dtypes)} inputs or parameters of one dtype"
    dtype = sx.dtype
    dims = len(sx.shape) - 2
    c_in, c_out = (sw.shape[0], sw.shape[1] * groups) if transposed else (sw.shape[1] * groups, sw.shape[0])
    if not 1 <= dims <= 3 or len(sw.shape) != dims + 2 or c_in != sx.shape[1] or c_in % groups or c_out % groups:
        return f"a convolution over {dims} spatial dims with weight {list(sw.shape)}"
    geometry = [_ints(v, dims) for v in (stride, padding, dilation, output_padding if transposed else 0)]
    if any(g is None for g in geometry):
        return f"convolution geometry {stride}, {padding}, {dilation}, {output_padding} is not integers per spatial dim"
    (st, pad, dil, out_pad) = geometry  # type: ignore[misc]
    if bias is not None:
        sb = leaf_spec(problem, bias) if is_ref(bias) else None
        if sb is None or sb.dtype != dtype or tuple(sb.shape) != (c_out,):
            return f"the convolution's bias is not a {DTYPE_NAMES[dtype]} vector over the output channels"
    full = tuple(first.shape)
    rest = tuple(problem.graph[1:])
    pooled = spatial_pool(rest, first.out, full)
    if isinstance(pooled, str):
        return pooled
    if pooled is None:
        epi = compile_chain(problem, rest, first.out, full, dtype=dtype, bias=bias, channels=True, casts=dtype != "float32")
    else:
        epi = compile_chain(problem, rest[:pooled[0]], first.out, full, dtype=dtype, bias=bias, channels=True,
                            result=rest[pooled[0]].args[0], casts=dtype != "float32")
    if isinstance(epi, str):
        return epi
    if pooled and tuple(problem.graph_outputs) != (problem.graph[-1].out,):
        return "the forward's output is not the pooled values"
    pool = (pooled[1], tuple(problem.graph[-1].shape)) if pooled else (0.0, ())
    if pooled and (pool[0] == 0 or not math.isfinite(pool[0])):
        return f"the pooling is scaled by {pool[0]}"
    return ConvMatch(x, w, sx.shape[0], c_in, c_out, tuple(sx.shape[2:]), tuple(sw.shape[2:]), st, pad, dil,
                     full[2:], epi, bool(transposed), out_pad if transposed else (), groups, *pool, dtype=dtype)


def pointwise(f: ConvMatch) -> str | None:
    """Why the convolution is not one image-by-image GEMM of x's planes (1x1, stride 1, unpadded, neither
    transposed nor grouped, not pooled), or None: each output pixel is the input pixel at its place."""
    if f.transposed or f.groups != 1:
        return "a transposed or grouped convolution"
    if set(f.kernel) != {1} or set(f.stride) != {1} or set(f.padding) != {0}:
        return f"a {'x'.join(map(str, f.kernel))} convolution of stride {f.stride}, padding {f.padding}: not 1x1, stride 1, unpadded"
    if f.pool:
        return "a convolution summed over its pixels (the implicit-GEMM family's case)"
    return None
