"""Normalizations by statistics over one dim or a row of dims: L1 (x / mean|x|), L2 (x / ||x||),
RMS (x / sqrt(mean x^2 + eps)) over the last dim or a middle one, instance norm (traced as a
batch norm over a (1, N*C, ...) view, of any view of the input), group norm with its per-channel
affine, and layer norm over trailing dims with its elementwise affine; a norm op may be followed by
an elementwise chain, fused into the write pass (a group norm, then hardtanh or x * sigmoid(x) * w;
its operands may be further inputs, as a residual is). Rows (the stats run over contiguous memory):
one block per row, a stats pass and a write pass. A middle dim: one thread per output column, both
passes down the column (the second from cache), or for columns of at most 64 the column held in
registers (one read). fp32, fp16 or bf16 tensors (halves loaded one element at a time), statistics in
fp64, the output in the input's dtype."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cuforge.kernels.base import GraphFamily
from cuforge.kernels.chains import CTYPES, Epilogue, compile_chain
from cuforge.kernels.leaves import LEAF_VIEWS, leaf_spec
from cuforge.op_graph import OpNode, constant_dims, is_ref
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec
from cuforge.kernels.registry import family


@dataclass(frozen=True)
class NormalizeMatch:
    kind: str  # l1 | l2 | rms | instance | group | layer
    outer: int
    reduced: int  # the length each statistic runs over
    inner: int  # 1: rows (contiguous); > 1: a middle dim
    eps: float = 0.0
    weight: str | None = None  # group norm's per-channel affine, layer norm's per-element one
    bias: str | None = None
    groups: int = 1
    channel_span: int = 1  # elements of one channel within a group's row (H*W)
    epilogue: Epilogue = Epilogue()  # the elementwise chain after a norm op
    dtype: str = "float32"  # the input's, the affine's and the output's; the statistics are fp64


def _keepdim(node: OpNode, index: int) -> bool:
    return (len(node.args) > index and node.args[index] is True) or node.kwarg("keepdim") is True


def _split(shape: tuple[int, ...], dim: int) -> tuple[int, int, int]:
    return math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:])


def _by_stat(problem: Problem, shape: tuple[int, ...]) -> NormalizeMatch | str:
    """x / stat(x) with stat a keepdim L1 mean, L2 norm or RMS over one dim."""
    g = problem.graph
    ndim = len(shape)
    last = g[-1]
    if last.op != "div" or last.args[0] != "in0" or not is_ref(last.args[1]):
        return "does not end in x / statistic"
    if len(g) == 3 and g[0].op == "abs" and g[0].args[0] == "in0" and g[1].op == "mean" and g[1].args[0] == g[0].out \
            and _keepdim(g[1], 2) and last.args[1] == g[1].out:
        kind, dims, eps = "l1", constant_dims(g[1].args[1], ndim), 0.0
    elif len(g) == 2 and g[0].op == "linalg_vector_norm" and g[0].args[0] == "in0" and len(g[0].args) >= 4 \
            and g[0].args[1] == 2 and _keepdim(g[0], 3) and last.args[1] == g[0].out and g[0].kwarg("dtype") is None:
        kind, dims, eps = "l2", constant_dims(g[0].args[2], ndim), 0.0
    elif len(g) == 5 and [n.op for n in g] == ["pow", "mean", "add", "sqrt", "div"] and g[0].args == ("in0", 2) \
            and g[1].args[0] == g[0].out and _keepdim(g[1], 2) and g[2].args[0] == g[1].out \
            and isinstance(g[2].args[1], (int, float)) and not is_ref(g[2].args[1]) and g[3].args[0] == g[2].out \
            and last.args[1] == g[3].out:
        kind, dims, eps = "rms", constant_dims(g[1].args[1], ndim), float(g[2].args[1]) * float(g[2].kwarg("alpha", 1))
    else:
        return "not an L1, L2 or RMS normalization over one dim"
    if dims is None or len(dims) != 1:
        return "the statistic runs over more than one dim"
    outer, reduced, inner = _split(shape, dims[0])
    return NormalizeMatch(kind, outer, reduced, inner, eps)


def _by_norm_op(problem: Problem, shape: tuple[int, ...]) -> NormalizeMatch | str:
    """Instance norm (batch norm of a (1, N*C, ...) view, training statistics, no affine), group norm, and
    layer norm over trailing dims (one row per sample, elementwise affine)."""
    g = [n for n in problem.graph if not (n.op == "empty" and n.out.startswith("c"))]  # dead meta placeholders
    if g and g[0].op in ("native_group_norm", "native_layer_norm"):
        found, head, anchor = _norm_op(problem, shape, g[:1]), 1, g[0].out
    else:
        span = _instance_span(g, shape)
        if isinstance(span, str):
            return span
        head, anchor = span
        found = _norm_op(problem, shape, g[:head])
    if isinstance(found, str):
        return found
    if len(g) > head:  # an elementwise chain after the norm: the write pass applies it
        dtype = problem.inputs[0].dtype
        epi = compile_chain(problem, tuple(g[head:]), anchor, shape, dtype=dtype, allow_rowsum=False, casts=dtype != "float32")
        if isinstance(epi, str):
            return epi
        found = NormalizeMatch(**{**found.__dict__, "epilogue": epi})
    return found


def _instance_span(g: list[OpNode], shape: tuple[int, ...]) -> tuple[int, str] | str:
    """An instance norm's nodes: views of in0, the batch norm, views of its result back to in0's shape
    (the input is contiguous, so every view keeps its memory order: KernelBench level2/28 normalizes a
    GEMM's rows as (1, N, 1, F)). Their count and the name the chain after them reads."""
    i, src = 0, "in0"
    while i < len(g) and g[i].op in LEAF_VIEWS and g[i].args and g[i].args[0] == src:
        src, i = g[i].out, i + 1
    if i == 0 or i >= len(g) or g[i].op != "native_batch_norm":
        return "not an instance, group or layer norm"
    j, out = i + 1, {g[i].out, f"{g[i].out}.0"}
    last = ""
    while j < len(g) and g[j].op in LEAF_VIEWS and g[j].args and g[j].args[0] in out:
        out, last, j = {g[j].out}, g[j].out, j + 1
    if not last or tuple(g[j - 1].shape) != shape:
        return "an instance norm whose result is not viewed back to the input's shape"
    return j, last


def _norm_op(problem: Problem, shape: tuple[int, ...], g: list[OpNode]) -> NormalizeMatch | str:
    if len(g) == 1 and g[0].op == "native_group_norm":
        _, w, b, n, c, hw, groups, eps = (list(g[0].args) + [None] * 8)[:8]
        if not all(isinstance(v, int) for v in (n, c, hw, groups)) or groups <= 0 or c % groups or n * c * hw != math.prod(shape):
            return "a group norm with unexpected sizes"
        for ref in (w, b):
            spec = leaf_spec(problem, ref) if is_ref(ref) else None
            if ref is not None and (spec is None or spec.dtype != problem.inputs[0].dtype or tuple(spec.shape) != (c,)):
                return "a group norm whose affine is not two per-channel parameters of the input's dtype"
        return NormalizeMatch("group", n * groups, (c // groups) * hw, 1, float(eps), w, b, groups, hw)
    if len(g) == 1 and g[0].op == "native_layer_norm" and g[0].args[0] == "in0":
        _, normalized, w, b, eps = (list(g[0].args) + [None] * 5)[:5]
        normalized = tuple(normalized) if isinstance(normalized, (tuple, list)) else ()
        if not normalized or shape[len(shape) - len(normalized):] != normalized or not isinstance(eps, (int, float)):
            return "a layer norm over other than the trailing dims"
        for ref in (w, b):
            spec = leaf_spec(problem, ref) if is_ref(ref) else None
            if ref is not None and (spec is None or spec.dtype != problem.inputs[0].dtype or tuple(spec.shape) != normalized):
                return "a layer norm whose affine is not two parameters of the normalized shape and the input's dtype"
        reduced = math.prod(normalized)
        return NormalizeMatch("layer", math.prod(shape) // reduced, reduced, 1, float(eps), w, b)
    bns = [k for k, n in enumerate(g) if n.op == "native_batch_norm"]
    if len(bns) == 1 and 0 < bns[0] < len(g) - 1:  # views, the batch norm, views (_instance_span)
        bn = g[bns[0]]
        view = tuple(g[bns[0] - 1].shape)
        if bn.args[0] != g[bns[0] - 1].out or any(a is not None for a in bn.args[1:5]) or bn.args[5] is not True \
                or len(view) < 3 or view[0] != 1:
            return "a batch norm that is not an instance norm (training statistics, no affine, over a (1, N*C, ...) view)"
        return NormalizeMatch("instance", view[1], math.prod(view[2:]), 1, float(bn.args[7]))
    return "not an instance, group or layer norm"


def match_normalize(problem: Problem) -> NormalizeMatch | str:
    # in0 is normalized; other inputs may only be operands of the chain after the norm (compile_chain's).
    if not problem.graph:
        return "no traced graph"
    dtype = problem.inputs[0].dtype if problem.inputs else None
    if dtype not in CTYPES or any(x.dtype != dtype for x in problem.inputs) or len(problem.inputs[0].shape) < 2:
        return "needs fp32, fp16 or bf16 inputs of one dtype, the first of at least 2 dims"
    shape = tuple(problem.inputs[0].shape)
    if len(problem.outputs) != 1 or tuple(problem.outputs[0].shape) != shape or problem.outputs[0].dtype != dtype:
        return "the output must have the input's shape and dtype"
    found = _by_stat(problem, shape)
    if isinstance(found, str):
        other = _by_norm_op(problem, shape)
        if isinstance(other, str):
            return f"{found}; {other}"
        found = other
    if found.reduced >= 2**31 or found.outer >= 2**31:
        return "rows and columns must fit in 32-bit ints"
    return NormalizeMatch(**{**found.__dict__, "dtype": dtype})


HOLD_MAX = 64  # a middle dim this short is held in registers (one value per row, per thread)


@family(190)
class Normalize(GraphFamily):
    """Rows: BLOCK threads per row, VEC-wide loads, double-precision sums, a block reduction, then the
    row is read again and written. A middle dim: BLOCK threads across the inner dim per block."""

    def __init__(self) -> None:
        super().__init__("normalize", {"VEC": (1, 4), "BLOCK": (128, 256, 512, 1024), "HOLD": (False, True)})

    DEFAULTS = {"HOLD": False}  # configs from before the knob

    def match(self, problem: Problem) -> NormalizeMatch | str:
        return match_normalize(problem)

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        m = self.matched(problem)
        if c.get("HOLD"):  # a middle dim's column in registers: short columns only
            return m.inner > 1 and m.reduced <= HOLD_MAX and c["VEC"] == 1 and c["BLOCK"] <= 512
        # float4 loads and stores: rows of fp32 only (a half tensor's elements go one at a time)
        return c["VEC"] == 1 or (m.inner == 1 and m.dtype == "float32")

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        m = self.matched(problem)
        if m.inner > 1:
            held = [dict(VEC=1, BLOCK=256, HOLD=True), dict(VEC=1, BLOCK=128, HOLD=True)] if m.reduced <= HOLD_MAX else []
            return held + [dict(VEC=1, BLOCK=256, HOLD=False), dict(VEC=1, BLOCK=128, HOLD=False), dict(VEC=1, BLOCK=512, HOLD=False)]
        block = 1024 if m.reduced >= 65536 else 512 if m.reduced >= 4096 else 128
        other = 256 if block != 256 else 512
        if m.dtype != "float32":
            return [dict(VEC=1, BLOCK=block, HOLD=False), dict(VEC=1, BLOCK=other, HOLD=False)]
        return [dict(VEC=4, BLOCK=block, HOLD=False), dict(VEC=4, BLOCK=other, HOLD=False),
                dict(VEC=1, BLOCK=block, HOLD=False)]

    def extra(self, problem: Problem) -> dict[str, Any]:
        m = self.matched(problem)
        return {"KIND": m.kind, "ROWS": m.inner == 1, "ALIGNED": m.reduced % 4 == 0, "CTYPE": CTYPES[m.dtype], "EPS": repr(float(m.eps)) + "f",
                "AFFINE_W": m.weight is not None, "AFFINE_B": m.bias is not None, "GROUPS": m.groups,
                "CPG_SPAN": m.channel_span, "CPG": m.reduced // m.channel_span, "EPI": m.epilogue,
                "LAST_DIM": problem.inputs[0].shape[-1], "R": m.reduced}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        m = self.matched(problem)
        affine = tuple(r for r in (m.weight, m.bias) if r is not None)
        grid = "(outer,)" if m.inner == 1 else f"(outer * cdiv(inner, {c['BLOCK']}),)"
        return LaunchSpec(entry=self.name, grid=grid, block=f"({c['BLOCK']},)",
                          args=("in0", "out0", "reduced", "inner", *affine, *m.epilogue.launch_args()),
                          outputs=(("in0.shape", m.dtype),),
                          bindings=(("outer", str(m.outer)), ("reduced", str(m.reduced)), ("inner", str(m.inner))))
