"""Losses built from per-row reductions (TripletMarginLoss, distance- and norm-based losses): elementwise
ops over fp32 inputs of one shape, reductions of them over the last dim (an L2 norm, a sum, a mean),
elementwise ops on those row values, then the mean or sum over the rows. One kernel: a block per row
(grid-stride over rows) reads every input once, reduces in double, finishes the row's value and adds
it to a double total; a one-thread pass writes the scalar."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from cuforge.kernels.base import GraphFamily
from cuforge.kernels.chains import BINARY, UNARY, _binary, _unary, literal
from cuforge.op_graph import OpNode, constant_dims, is_ref
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec
from cuforge.kernels.registry import family


@dataclass(frozen=True)
class Reduction:
    kind: str  # norm2 | sum | mean
    operand: str  # the C expression summed (before squaring, for norm2)


@dataclass(frozen=True)
class RowLossMatch:
    rows: int
    cols: int
    inputs: tuple[int, ...]  # the forward's inputs the kernel reads, in its argument order
    element: str  # C statements computing the element-level values (x<k>) from the loaded inputs (v<i>)
    reductions: tuple[Reduction, ...]
    row: str  # C statements computing the row's value from the reductions (r<j>)
    row_value: str
    mean: bool  # the final reduction is a mean (else a sum)


def _row_reduction(node: OpNode, ndim: int) -> str | None:
    """norm2, sum or mean for a reduction over exactly the last dim, else None."""
    if node.op in ("norm", "linalg_vector_norm"):
        p = node.args[1] if len(node.args) > 1 else node.kwarg("p", 2)
        dims = node.args[2] if len(node.args) > 2 else node.kwarg("dim")
        if p in (2, 2.0) and constant_dims(dims, ndim) == (ndim - 1,) and node.kwarg("dtype") is None:
            return "norm2"
        return None
    if node.op == "sum_lastdim":  # the tracer's name for a sum over the last dim
        return "sum"
    if node.op in ("sum", "mean") and len(node.args) >= 2 and constant_dims(node.args[1], ndim) == (ndim - 1,) \
            and node.kwarg("dtype") is None:
        return node.op
    return None


def _expr(node: OpNode, env: dict[str, str]) -> str | None:
    """The node's C expression over values in env and numeric constants, or None."""
    operands = []
    for a in node.args[: 2 if node.op in BINARY else 1]:
        if is_ref(a):
            if a not in env:
                return None
            operands.append(env[a])
        elif isinstance(a, (int, float)):
            operands.append(literal(a))
        else:
            return None
    if not any(is_ref(a) for a in node.args[: 2 if node.op in BINARY else 1]):
        return None
    if node.op in UNARY and len(operands) == 1:
        return _unary(node.op, node, operands[0])
    if node.op in BINARY and len(operands) == 2:
        return _binary(node.op, node, *operands)
    return None


def match_row_loss(problem: Problem) -> RowLossMatch | str:
    graph = problem.graph
    if not graph or len(problem.outputs) != 1 or tuple(problem.outputs[0].shape) != () or problem.outputs[0].dtype != "float32":
        return "needs one fp32 scalar output"
    shapes = {tuple(x.shape) for x in problem.inputs}
    if len(shapes) != 1 or any(x.dtype != "float32" for x in problem.inputs) or len(next(iter(shapes))) < 2:
        return "needs fp32 inputs of one shape of at least 2 dims"
    full = next(iter(shapes))
    rows, cols = math.prod(full[:-1]), full[-1]
    last = graph[-1]
    if last.op not in ("mean", "sum") or len(last.args) != 1 or problem.graph_outputs != (last.out,):
        return "does not end in the mean or sum of all elements"
    env = {f"in{i}": f"v{i}" for i in range(len(problem.inputs))}
    element: list[str] = []
    reductions: list[Reduction] = []
    row_lines: list[str] = []
    for k, node in enumerate(graph[:-1]):
        size = math.prod(node.shape)
        kind = _row_reduction(node, len(full))
        if kind is not None:
            if not is_ref(node.args[0]) or node.args[0] not in env or env[node.args[0]].startswith("r"):
                return f"{node.op} of something other than an element-level value"
            env[node.out] = f"r{len(reductions)}"
            reductions.append(Reduction(kind, env[node.args[0]]))
            continue
        expr = _expr(node, env)
        if expr is None:
            return f"{node.op} is not an elementwise op over the inputs or the row values"
        level = {env[a][0] for a in node.args if is_ref(a)}
        if tuple(node.shape) == full and level <= {"v", "x"}:
            element.append(f"const float x{k} = {expr};")
            env[node.out] = f"x{k}"
        elif size == rows and level <= {"r"}:
            row_lines.append(f"const float r_{k} = {expr};")
            env[node.out] = f"r_{k}"
        else:
            return f"{node.op} mixes element-level and row-level values, or has shape {list(node.shape)}"
    if not reductions:
        return "no reduction over the last dim"
    if not is_ref(last.args[0]) or last.args[0] not in env or not env[last.args[0]].startswith("r"):
        return "the final reduction is not over row values"
    used = sorted({int(v[1:]) for r in reductions for v in _names(r.operand + "\n" + "\n".join(element)) if v.startswith("v")})
    return RowLossMatch(rows, cols, tuple(used), "\n".join(element), tuple(reductions), "\n".join(row_lines),
                        env[last.args[0]], last.op == "mean")


def _names(code: str) -> set[str]:
    return set(re.findall(r"\bv\d+\b", code))


@family(280)
class RowLoss(GraphFamily):
    """BLOCK threads a row, VEC-wide loads, rows grid-strided over about WAVES blocks per multiprocessor."""

    def __init__(self) -> None:
        super().__init__("row_loss", {"BLOCK": (64, 128, 256, 512), "VEC": (1, 4), "WAVES": (2, 4, 8)})

    def match(self, problem: Problem) -> RowLossMatch | str:
        return match_row_loss(problem)

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        return c["VEC"] == 1 or self.matched(problem).cols % 4 == 0

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        m = self.matched(problem)
        vec = 4 if m.cols % 4 == 0 else 1
        block = 256 if m.cols >= 4096 else 128 if m.cols >= 512 else 64
        return [dict(BLOCK=block, VEC=vec, WAVES=4), dict(BLOCK=block * 2 if block < 512 else 128, VEC=vec, WAVES=2),
                dict(BLOCK=block, VEC=1, WAVES=8)]

    def extra(self, problem: Problem) -> dict[str, Any]:
        return {"M": self.matched(problem)}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        m = self.matched(problem)
        ins = tuple(f"in{i}" for i in m.inputs)
        rows_grid = f"(max(1, min({m.rows}, SMS * {c['WAVES'] * 2048 // c['BLOCK']})),)"
        # The rows' pass adds into a double total; the main launch (one thread) writes the scalar.
        return LaunchSpec(entry=self.name, grid="(1,)", block="(1,)", args=("scratch0", "out0"), outputs=(("()", "float32"),),
                          bindings=(("SMS", "torch.cuda.get_device_properties(in0.device).multi_processor_count"),),
                          scratch=(("(1,)", "float64", "zeros"),),
                          pre=((f"{self.name}_rows", rows_grid, f"({c['BLOCK']},)", f"({', '.join(ins)}, scratch0)"),))
