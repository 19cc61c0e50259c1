"""Cross-entropy over the rows of fp32 logits with int64 class targets (traced as log_softmax over the
last dim, then nll_loss), mean or sum over the rows, ignore_index honoured, no class weights: one block
per row computes the row's log-sum-exp in one online pass, one double atomic per row, and the last
block to finish divides by the rows counted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cuforge.kernels.base import GraphFamily
from cuforge.problems.problem import Problem
from cuforge.sandbox.candidate import LaunchSpec


@dataclass(frozen=True)
class CrossEntropyMatch:
    rows: int
    classes: int
    mean: bool
    ignore_index: int


def match_cross_entropy(problem: Problem) -> CrossEntropyMatch | str:
    g = problem.graph
    if len(g) != 2 or g[0].op != "_log_softmax_lastdim" or g[1].op != "nll_loss_forward":
        return "not log_softmax over the last dim followed by nll_loss"
    ls, nll = g
    ins = problem.inputs
    if len(ins) != 2 or ins[0].dtype != "float32" or len(ins[0].shape) != 2 or ins[1].dtype != "int64" \
            or tuple(ins[1].shape) != (ins[0].shape[0],) or ls.args[0] != "in0":
        return "needs [N, C] fp32 logits and [N] int64 targets"
    args = list(nll.args) + [None] * 5
    if args[0] != ls.out or args[1] != "in1" or args[2] is not None:
        return "nll_loss of other than the log-probabilities and the targets, or with class weights"
    reduction, ignore = args[3], args[4]
    if reduction not in (1, 2) or not isinstance(ignore, int):
        return "nll_loss without a mean or sum reduction"
    if problem.graph_outputs not in ((nll.out,), (f"{nll.out}.0",)):
        return "the forward's output is not the loss"
    if ins[0].shape[1] >= 2**31 or ins[0].shape[0] >= 2**31:
        return "rows and classes must fit in 32-bit ints"
    return CrossEntropyMatch(ins[0].shape[0], ins[0].shape[1], reduction == 1, ignore)


class CrossEntropy(GraphFamily):
    def __init__(self) -> None:
        super().__init__("cross_entropy", {"VEC": (1, 4), "BLOCK": (128, 256, 512, 1024)})

    def match(self, problem: Problem) -> CrossEntropyMatch | str:
        return match_cross_entropy(problem)

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        classes = self.matched(problem).classes
        block = 512 if classes >= 4096 else 256 if classes >= 1024 else 128
        return [dict(VEC=4, BLOCK=block), dict(VEC=4, BLOCK=1024 if block != 1024 else 256), dict(VEC=1, BLOCK=block)]

    def extra(self, problem: Problem) -> dict[str, Any]:
        m = self.matched(problem)
        return {"MEAN": m.mean, "IGNORE": m.ignore_index, "ALIGNED": m.classes % 4 == 0}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        return LaunchSpec(entry=self.name, grid="(rows,)", block=f"({c['BLOCK']},)",
                          args=("in0", "in1", "out0", "rows", "classes", "scratch0", "scratch1"),
                          outputs=(("()", "float32"),), scratch=(("(2,)", "float64", "zeros"), ("(1,)", "int32", "zeros")),
                          bindings=(("rows", "in0.shape[0]"), ("classes", "in0.shape[1]")))
