"""Cross-entropy over the rows of fp32, fp16 or bf16 logits with int64 class targets (traced as log_softmax
over the last dim, then nll_loss), mean or sum over the rows, ignore_index honoured, label smoothing (the
tail PyTorch traces after nll_loss: the rows' sums of log-probabilities, ignored rows zeroed, scaled and
added; each row's sum is C * lse - the sum of its logits, from the same pass), no class weights: a warp
per row computes the row's log-sum-exp in one pass (each chunk of loads reduced to its max and sum of
exponentials, merged online), a block's rows meet in one set of double atomics (loss, rows counted,
and with label smoothing the rows' sums), and the last block
to finish divides by the rows counted. (One block per row and a pair of atomics per row, which this
replaces, ran KernelBench's 32768 x 4096 file at 0.56 of the copy bandwidth.)"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cuforge.kernels.base import GraphFamily
from cuforge.kernels.chains import CTYPES, per_16_bytes
from cuforge.problems.problem import OpNode, Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec
from cuforge.kernels.registry import family


@dataclass(frozen=True)
class CrossEntropyMatch:
    rows: int
    classes: int
    mean: bool
    ignore_index: int
    dtype: str = "float32"  # of the logits and the loss
    # Label smoothing: loss = NLL_FACTOR * nll + SMOOTH_FACTOR * (sum over rows of -sum_j log p_j), each
    # over the rows counted where the reduction is a mean. None: plain cross-entropy.
    smoothing: tuple[float, float] | None = None


DTYPES = ("float32", "float16", "bfloat16")
# PyTorch's label-smoothing tail after nll_loss, op by op, for a mean and for a sum.
SMOOTH_MEAN = ("sum_lastdim", "neg", "eq", "masked_fill_", "bitwise_not", "sum", "sum", "div", "mul", "mul", "add")
SMOOTH_SUM = ("sum_lastdim", "neg", "eq", "masked_fill_", "sum", "mul", "mul", "add")


def _factor(node: OpNode, ref: str) -> float | None:
    """k where `node` is ref * k (a constant), else None."""
    if node.op != "mul" or len(node.args) != 2 or node.kwargs:
        return None
    a, b = node.args
    k = b if a == ref else a if b == ref else None
    return float(k) if isinstance(k, (int, float)) and not isinstance(k, bool) else None


def match_smoothing(tail: tuple[OpNode, ...], logp: str, nll: str, target: str, ignore: int, mean: bool,
                    output: tuple[str, ...]) -> tuple[float, float] | str:
    """(nll factor, smoothing factor) of PyTorch's label-smoothing tail, or why `tail` is not it."""
    if tuple(n.op for n in tail) != (SMOOTH_MEAN if mean else SMOOTH_SUM):
        return "ops after nll_loss other than label smoothing's"
    row_sum, neg, eq, fill = tail[:4]
    if row_sum.args[:1] != (logp,) or tuple(row_sum.args[1]) not in ((1,), (-1,)) or neg.args != (row_sum.out,) \
            or eq.args != (target, ignore) or fill.args != (neg.out, eq.out, 0.0):
        return "label smoothing's row sums over other values than the log-probabilities"
    if mean:
        kept, count, total, div = tail[4:8]
        if kept.op != "bitwise_not" or kept.args != (eq.out,) or count.args != (kept.out,) or total.args != (fill.out,) \
                or div.args != (total.out, count.out):
            return "label smoothing's mean over other rows than those counted"
        smoothed = div.out
    else:
        smoothed = tail[4].out
        if tail[4].args != (fill.out,):
            return "label smoothing's sum over other values"
    scale_s, scale_n, add = tail[-3:]
    ks, kn = _factor(scale_s, smoothed), _factor(scale_n, nll)
    if ks is None or kn is None or set(add.args) != {scale_s.out, scale_n.out} or len(add.args) != 2 or add.kwargs:
        return "label smoothing's terms not scaled by constants and added"
    if output not in ((add.out,), (f"{add.out}.0",)):
        return "the forward's output is not the smoothed loss"
    return kn, ks


def match_cross_entropy(problem: Problem) -> CrossEntropyMatch | str:
    g = problem.graph
    if len(g) < 2 or g[0].op != "_log_softmax_lastdim" or g[1].op != "nll_loss_forward":
        return "not log_softmax over the last dim followed by nll_loss"
    ls, nll = g[:2]
    ins = problem.inputs
    if len(ins) != 2 or ins[0].dtype not in DTYPES or len(ins[0].shape) != 2 or ins[1].dtype != "int64" \
            or tuple(ins[1].shape) != (ins[0].shape[0],) or ls.args[0] != "in0":
        return "needs [N, C] fp32, fp16 or bf16 logits and [N] int64 targets"
    if problem.outputs[0].dtype != ins[0].dtype:
        return "a loss of another dtype than the logits"
    args = list(nll.args) + [None] * 5
    if args[0] != ls.out or args[1] != "in1" or args[2] is not None:
        return "nll_loss of other than the log-probabilities and the targets, or with class weights"
    reduction, ignore = args[3], args[4]
    if reduction not in (1, 2) or not isinstance(ignore, int) or isinstance(ignore, bool):
        return "nll_loss without a mean or sum reduction"
    smoothing = None
    if len(g) > 2:
        found = match_smoothing(g[2:], ls.out, nll.out, "in1", ignore, reduction == 1, problem.graph_outputs)
        if isinstance(found, str):
            return found
        smoothing = found
    elif problem.graph_outputs not in ((nll.out,), (f"{nll.out}.0",)):
        return "the forward's output is not the loss"
    if ins[0].shape[1] >= 2**31 or ins[0].shape[0] >= 2**31:
        return "rows and classes must fit in 32-bit ints"
    return CrossEntropyMatch(ins[0].shape[0], ins[0].shape[1], reduction == 1, ignore, ins[0].dtype, smoothing)


@family(230)
class CrossEntropy(GraphFamily):
    def __init__(self) -> None:
        super().__init__("cross_entropy", {"VEC": (1, 4, 8), "WARPS": (4, 8), "RPW": (1, 4, 16), "UNROLL": (2, 4, 8)})

    def match(self, problem: Problem) -> CrossEntropyMatch | str:
        return match_cross_entropy(problem)

    def valid(self, config: dict[str, Any], problem: Problem) -> bool:
        m = self.matched(problem)
        wide = per_16_bytes(m.dtype)  # elements of one 16-byte load
        return config["VEC"] == 1 or (config["VEC"] == wide and m.classes % wide == 0)

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        m = self.matched(problem)
        wide = per_16_bytes(m.dtype)
        vec = wide if m.classes % wide == 0 else 1
        # Enough loads in flight for a long row; rows enough a block that few blocks meet in the atomics.
        unroll = 8 if m.classes >= 32 * 8 * vec * 2 else 4 if m.classes >= 32 * 4 * vec else 2
        rpw = 16 if m.rows >= 132 * 8 * 16 else 4 if m.rows >= 132 * 8 * 4 else 1
        out = [dict(VEC=vec, WARPS=8, RPW=rpw, UNROLL=unroll), dict(VEC=vec, WARPS=4, RPW=rpw, UNROLL=unroll),
               dict(VEC=vec, WARPS=8, RPW=max(1, rpw // 4), UNROLL=unroll), dict(VEC=vec, WARPS=8, RPW=rpw, UNROLL=max(2, unroll // 2)),
               dict(VEC=1, WARPS=8, RPW=rpw, UNROLL=unroll)]
        return [c for i, c in enumerate(out) if c not in out[:i]]

    def extra(self, problem: Problem) -> dict[str, Any]:
        m = self.matched(problem)
        kn, ks = m.smoothing or (1.0, 0.0)
        # The factors as double literals: the loss's terms are summed in double and rounded once.
        return {"MEAN": m.mean, "IGNORE": m.ignore_index, "SMOOTH": m.smoothing is not None, "NLL_K": repr(kn),
                "SMOOTH_K": repr(ks), "CTYPE": CTYPES[m.dtype]}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        return LaunchSpec(entry=self.name, grid=f"(cdiv(rows, {c['WARPS'] * c['RPW']}),)", block=f"({32 * c['WARPS']},)",
                          args=("in0", "in1", "out0", "rows", "classes", "scratch0", "scratch1"),
                          outputs=(("()", self.matched(problem).dtype),),
                          scratch=(("(3,)", "float64", "zeros"), ("(1,)", "int32", "zeros")),
                          bindings=(("rows", "in0.shape[0]"), ("classes", "in0.shape[1]")))
