"""Row norms over the last dim: layernorm (traced as native_layer_norm) and rmsnorm (as the ops it is
written with: pow, mean, add eps, rsqrt, mul [, mul weight]), each followed by the traced elementwise
epilogue (GELU and a residual add, a SiLU gate, ...). eps comes from the trace. Inputs, weights and
output in fp32, fp16 or bf16, the statistics and the epilogue in fp32 (as PyTorch computes a half
precision norm); an rmsnorm written as LLaMA's (`x.float()`, the norm, `.to(x.dtype)`, the weight)
rounds where the model does."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

from cuforge.kernels.base import SMEM_LIMIT, Family
from cuforge.kernels.chains import CTYPES, Epilogue, compile_chain, literal
from cuforge.kernels.leaves import leaf_spec
from cuforge.op_graph import OpNode, is_last_dim, is_ref
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec
from cuforge.kernels.registry import family


FLOATS = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class NormMatch:
    kind: str  # "layernorm" | "rmsnorm"
    x: str
    weight: str | None
    bias: str | None
    eps: float
    rows: int
    cols: int
    epilogue: Epilogue
    dtype: str = "float32"  # of the input, the weight and bias, the epilogue's operands and the output


def _vector(problem: Problem, ref: Any, cols: int, dtype: str) -> str | None | bool:
    """A per-column vector ref of `dtype`, None for no tensor, False when it is something else."""
    if ref is None:
        return None
    spec = leaf_spec(problem, ref) if is_ref(ref) else None
    return ref if spec is not None and spec.dtype == dtype and tuple(spec.shape) == (cols,) else False


def _widened_input(problem: Problem, g: tuple[OpNode, ...]) -> tuple[OpNode, ...]:
    """The graph read as computing on a half-precision input itself where it starts by widening it to
    fp32 (`h = x.float()`): the kernel widens every value it loads."""
    first = g[0]
    if first.op != "_to_copy" or first.kwargs != (("dtype", "torch.float32"),) or not first.args \
            or not is_ref(first.args[0]):
        return g
    spec = leaf_spec(problem, first.args[0])
    if spec is None or spec.dtype not in ("float16", "bfloat16"):
        return g
    x = first.args[0]
    return tuple(replace(n, args=tuple(x if a == first.out else a for a in n.args)) for n in g[1:])


def _rmsnorm_prefix(problem: Problem, g: tuple[OpNode, ...], dtype: str = "float32") -> tuple[str, float, str | None, int] | str:
    """(x, eps, weight, nodes used) of x * rsqrt(mean(x^2, -1, keepdim) + eps) [* weight] at the graph's start."""
    if len(g) < 4:
        return "too few ops for an rmsnorm"
    sq = g[0]
    x = sq.args[0] if sq.args else None
    squares = (sq.op == "pow" and len(sq.args) == 2 and sq.args[1] == 2) or (sq.op == "mul" and sq.args[:2] == (x, x))
    if not squares or not is_ref(x) or leaf_spec(problem, x) is None:
        return "does not start with the square of an input"
    ndim = len(sq.shape)
    mean = g[1]
    if mean.op != "mean" and sq.shape[-1] == 1:
        # A mean over a last dim of one column left the graph at load (an identity reduction).
        stat, used = sq.out, 1
    elif mean.op != "mean" or mean.args[0] != sq.out or not is_last_dim(mean.args[1], ndim) or not (
            len(mean.args) > 2 and mean.args[2] is True or mean.kwarg("keepdim") is True):
        return "no mean of the squares over the last dim (keepdim)"
    else:
        stat, used = mean.out, 2
    if len(g) < used + 3:
        return "too few ops for an rmsnorm"
    add, root, scale = g[used:used + 3]
    if add.op != "add" or add.args[0] != stat or len(add.args) < 2 or is_ref(add.args[1]) \
            or not isinstance(add.args[1], (int, float)):
        return "no scalar eps added to the mean"
    eps = float(add.args[1]) * float(add.kwarg("alpha", 1))
    if root.op == "rsqrt" and root.args[0] == add.out and scale.op == "mul" and set(scale.args[:2]) == {x, root.out}:
        pass
    elif root.op == "sqrt" and root.args[0] == add.out and scale.op == "div" and scale.args[:2] == (x, root.out) \
            and scale.kwarg("rounding_mode") is None:
        pass
    else:
        return "the input is not scaled by rsqrt(mean + eps)"
    used, weight = used + 3, None
    if len(g) > used and g[used].op == "mul" and scale.out in g[used].args[:2]:
        other = [a for a in g[used].args[:2] if a != scale.out]
        w = _vector(problem, other[0], sq.shape[-1], dtype) if len(other) == 1 else False
        if w:
            used, weight = used + 1, w
    return x, eps, weight, used  # type: ignore[return-value]


def match_norm(problem: Problem) -> NormMatch | str:
    if not problem.graph:
        return "no traced graph"
    g = _widened_input(problem, problem.graph)
    if not g:
        return "only a cast"
    first = g[0]
    dtype = problem.outputs[0].dtype if len(problem.outputs) == 1 else ""
    if dtype not in FLOATS:
        return "needs one fp32, fp16 or bf16 output"
    if first.op == "native_layer_norm":
        x, shape, w, b, eps = (list(first.args) + [None] * 5)[:5]
        spec = leaf_spec(problem, x) if is_ref(x) else None
        if spec is None or spec.dtype != dtype or tuple(shape or ()) != (spec.shape[-1],):
            return "layer_norm is not over the last dim of an input of the output's dtype"
        cols = spec.shape[-1]
        weight, bias = _vector(problem, w, cols, dtype), _vector(problem, b, cols, dtype)
        if weight is False or bias is False:
            return f"layer_norm's weight or bias is not a per-column vector of the output's dtype ({dtype})"
        kind, used, anchor = "layernorm", 1, first
    else:
        found = _rmsnorm_prefix(problem, g, dtype)
        if isinstance(found, str):
            return f"neither a layer_norm nor an rmsnorm ({found})"
        x, eps, weight, used = found
        bias, kind, anchor = None, "rmsnorm", g[used - 1]
        spec = leaf_spec(problem, x)
        if spec is None or spec.dtype != dtype:
            return "the normalized input's dtype is not the output's"
    if not isinstance(eps, (int, float)) or isinstance(eps, bool):
        return "eps is not a constant"
    cols = spec.shape[-1]
    rows = spec.numel // max(cols, 1)
    if rows >= 2**31 or cols >= 2**31:
        return "rows and columns must fit in 32-bit ints"
    epi = compile_chain(problem, g[used:], anchor.out, tuple(spec.shape), dtype, allow_rowsum=False, casts=True)
    if isinstance(epi, str):
        return epi
    return NormMatch(kind, x, weight or None, bias or None, float(eps), rows, cols, epi, dtype)


@family(90)
class NormRows(Family):
    """Layernorm or rmsnorm over the last dim (fp32, fp16 or bf16) with the traced epilogue fused: one
    block per row (or, ROW_WARP, one warp per row), the row cached in shared memory (or re-read) between
    the statistics and the output pass, two-pass variance."""

    DEFAULTS: ClassVar[dict[str, Any]] = {"ROW_WARP": 0}
    WARP_ROW_MAX_COLS = 2048  # past this a warp loops over a row many times where a block would share it

    def __init__(self) -> None:
        super().__init__("norm_rows", {"BLOCK": (128, 256, 512, 1024), "VEC": (1, 4), "CACHE": ("smem", "global"),
                                       "ROW_WARP": (0, 1)})

    def supports(self, problem: Problem) -> str | None:
        found = match_norm(problem)
        return found if isinstance(found, str) else None

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        found = match_norm(problem)
        if isinstance(found, str):
            return False
        if c.get("ROW_WARP"):  # the row re-read through L1, never cached in a block's shared memory
            return c["CACHE"] == "global" and found.cols <= self.WARP_ROW_MAX_COLS
        return c["CACHE"] == "global" or found.cols * 4 <= SMEM_LIMIT - 1024

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        found = match_norm(problem)
        assert not isinstance(found, str)
        block = 1024 if found.cols >= 16384 else 512 if found.cols >= 4096 else 256 if found.cols >= 1024 else 128
        # Half that block first: on LLaMA's 4096 x 4096 RMSNorm (an H200) 256 threads a row ran 13% faster
        # than 512 in fp32 and 40% in bf16/fp16 (more blocks resident on each SM while rows wait on memory).
        out = [dict(BLOCK=max(128, block // 2), VEC=4, CACHE="smem"), dict(BLOCK=block, VEC=4, CACHE="smem"),
               dict(BLOCK=block, VEC=4, CACHE="global"), dict(BLOCK=block, VEC=1, CACHE="global")]
        # Short rows (a layer norm over the last dim of a convolution's output, 64 wide in KernelBench's
        # level2/34) leave a block per row mostly idle: a warp per row first there, and among the seeds
        # for rows a warp can still hold in a few vectors a thread.
        warp = dict(BLOCK=256, VEC=4, CACHE="global", ROW_WARP=1)
        out = [warp, *out] if found.cols <= 256 else [*out, warp] if found.cols <= 1024 else out
        return [c for c in out if self.valid(c, problem)]

    def extra(self, problem: Problem) -> dict[str, Any]:
        f = match_norm(problem)
        assert not isinstance(f, str)
        return {"KIND": f.kind, "HAS_W": f.weight is not None, "HAS_B": f.bias is not None, "EPS": literal(f.eps),
                "EPI": f.epilogue, "DTYPE": f.dtype, "CTYPE": CTYPES[f.dtype]}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        f = match_norm(problem)
        assert not isinstance(f, str)
        grid = f"(cdiv(rows, {c['BLOCK'] // 32}),)" if c.get("ROW_WARP") else "(rows,)"
        return LaunchSpec(entry=self.name, grid=grid, block=f"({c['BLOCK']},)",
                          shared_mem="cols * 4" if c["CACHE"] == "smem" else "0",
                          args=(f.x, f.weight or f.x, f.bias or f.x, "out0", "rows", "cols", *f.epilogue.launch_args()),
                          outputs=((f"{f.x}.shape", f.dtype),),
                          bindings=(("cols", f"{f.x}.shape[-1]"), ("rows", f"{f.x}.numel() // max(cols, 1)")))
