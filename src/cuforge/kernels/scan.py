"""Scans over the last dim of an fp32 tensor: cumsum and cumprod, inclusive, reversed (flip, scan,
flip), exclusive (a zero column concatenated before the scan of all but the last column) and masked
(the input times a bool mask of its shape, then scanned), each recognised from the traced graph."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cuforge.kernels.base import GraphFamily
from cuforge.kernels.chains import CTYPES
from cuforge.op_graph import OpNode, is_last_dim
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec
from cuforge.kernels.registry import family


@dataclass(frozen=True)
class ScanMatch:
    op: str  # "sum" | "prod"
    reverse: bool
    exclusive: bool
    mask: str | None  # a bool input multiplied in first
    cols: int
    dtype: str = "float32"  # the input's and the output's; carries are fp32 whatever it is


def _scan_node(node: OpNode, ndim: int) -> str | None:
    if node.op not in ("cumsum", "cumprod") or len(node.args) < 2 or node.kwarg("dtype") is not None:
        return None
    return ("sum" if node.op == "cumsum" else "prod") if is_last_dim(node.args[1], ndim) else None


def match_scan(problem: Problem) -> ScanMatch | str:
    """The forward as one scan over the last dim of its fp32, fp16 or bf16 input, or why it is not one."""
    g, ins = problem.graph, problem.inputs
    if not ins or ins[0].dtype not in CTYPES or not ins[0].shape:
        return "needs an fp32, fp16 or bf16 input"
    shape, dtype = tuple(ins[0].shape), ins[0].dtype
    ndim, cols = len(shape), shape[-1]
    if len(problem.outputs) != 1 or tuple(problem.outputs[0].shape) != shape or problem.outputs[0].dtype != dtype:
        return "the output must have the input's shape and dtype"
    by_out = {n.out: n for n in g}
    final = by_out.get(problem.graph_outputs[0]) if len(problem.graph_outputs) == 1 else None
    if final is None:
        return "no single traced output"
    reverse = exclusive = False
    mask = None
    if final.op == "flip":  # flip(scan(flip(x)))
        inner = by_out.get(final.args[0])
        source = by_out.get(inner.args[0]) if inner is not None else None
        if not (is_last_dim(final.args[1], ndim) and inner is not None and source is not None and source.op == "flip"
                and is_last_dim(source.args[1], ndim) and source.args[0] == "in0" and len(g) == 3):
            return "a flip that is not flip(scan(flip(x))) over the last dim"
        scan, reverse = inner, True
    elif final.op == "cat":  # cat((zeros of one column, scan(x[..., :-1])), last)
        parts = final.args[0]
        if not (isinstance(parts, (list, tuple)) and len(parts) == 2 and is_last_dim(final.args[1] if len(final.args) > 1 else 0, ndim)):
            return "a cat that is not (zeros, scan) over the last dim"
        zeros, scan = by_out.get(parts[0]), by_out.get(parts[1])
        if zeros is None or zeros.op not in ("zeros_like", "zeros") or tuple(zeros.shape) != shape[:-1] + (1,):
            return "the exclusive scan's first column is not zeros"
        head = by_out.get(scan.args[0]) if scan is not None else None
        if head is None or head.op not in ("slice", "narrow") or head.args[0] != "in0" or not is_last_dim(head.args[1], ndim) \
                or tuple(head.args[2:4]) != (0, cols - 1) or (len(head.args) > 4 and head.args[4] != 1):
            return "the exclusive scan does not scan all but the last column of the input"
        exclusive = True
    else:
        scan = final
    op = _scan_node(scan, ndim) if scan is not None else None
    if op is None:
        return "not a cumsum or cumprod over the last dim"
    src = scan.args[0]
    if not exclusive and src != "in0" and not reverse:
        pre = by_out.get(src)
        if pre is None or pre.op != "mul" or set(pre.args[:2]) != {"in0", "in1"} or len(ins) != 2 \
                or ins[1].dtype != "bool" or tuple(ins[1].shape) != shape or len(g) != 2:
            return "the scanned tensor is neither the input nor the input times a bool mask of its shape"
        mask = "in1"
    elif not reverse and not exclusive and len(g) != 1:
        return "more ops than the scan"
    if len(ins) != (2 if mask else 1):
        return "unexpected inputs"
    if cols >= 2**31 or ins[0].numel // max(cols, 1) >= 2**31:
        return "rows and columns must fit in 32-bit ints"
    return ScanMatch(op, reverse, exclusive, mask, cols, dtype)


@family(180)
class ScanRows(GraphFamily):
    """One block per row, BLOCK*VEC elements per step: each thread scans its VEC elements in registers,
    warps scan thread totals by shuffles, one warp scans the warp totals, a carry runs across steps."""

    def __init__(self) -> None:
        super().__init__("scan_rows", {"VEC": (1, 2, 4, 8, 16), "BLOCK": (128, 256, 512, 1024)})

    def match(self, problem: Problem) -> ScanMatch | str:
        return match_scan(problem)

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        cols = self.matched(problem).cols
        # Long rows: the widest block first (KernelBench's cumsum over 32768 columns on the H100: 1024 x 4
        # moves 0.995 of the copy bandwidth, 512 x 8 0.89, 256 x 16 0.76).
        if cols >= 16384:
            return [dict(VEC=4, BLOCK=1024), dict(VEC=8, BLOCK=512), dict(VEC=16, BLOCK=256)]
        block = 256 if cols >= 1024 else 128
        return [dict(VEC=4, BLOCK=block), dict(VEC=8, BLOCK=block), dict(VEC=2, BLOCK=block)]

    def extra(self, problem: Problem) -> dict[str, Any]:
        m = self.matched(problem)
        # float4 loads and stores: fp32 rows whose every start is 16-byte aligned (halves go one by one)
        return {"OP": m.op, "REVERSE": m.reverse, "EXCLUSIVE": m.exclusive, "MASK": m.mask is not None,
                "ALIGNED": m.cols % 4 == 0 and m.dtype == "float32", "CTYPE": CTYPES[m.dtype]}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        m = self.matched(problem)
        args = ("in0", *((m.mask,) if m.mask else ()), "out0", "rows", "cols")
        return LaunchSpec(entry=self.name, grid="(rows,)", block=f"({c['BLOCK']},)", args=args,
                          outputs=(("in0.shape", m.dtype),),
                          bindings=(("cols", "in0.shape[-1]"), ("rows", "in0.numel() // max(cols, 1)")))
