"""Softmax and log-softmax over the last dim, fp32 or fp16, with the traced elementwise ops before
(a scale, a causal mask built with triu/tril, a bias) and after it fused into the one read and one
write of the row. A row belongs to a warp (short rows) or a block (long rows); each thread keeps its
share of the row in registers between the statistics and the output pass, or re-reads it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cuforge.kernels.base import Family
from cuforge.kernels.chains import CTYPES, Epilogue, compile_chain, per_16_bytes
from cuforge.kernels.leaves import leaf_spec
from cuforge.op_graph import OpNode, is_ref
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec
from cuforge.kernels.registry import family

SOFTMAX_OPS = {"_softmax_lastdim": False, "_log_softmax_lastdim": True, "_safe_softmax_lastdim": False}  # op -> log
# scaled_dot_product_attention's softmax: a row that is -inf throughout comes out 0, not NaN.
SAFE_OPS = frozenset({"_safe_softmax_lastdim"})
MAX_CACHED = 64  # floats of the row one thread may hold in registers


@dataclass(frozen=True)
class SoftmaxMatch:
    x: str
    in_dtype: str
    out_dtype: str
    log: bool
    rows: int
    cols: int
    prologue: Epilogue
    epilogue: Epilogue
    safe: bool = False
    cols_expr: str = ""  # the row length at launch, over the input x: its last dim, or the dims a view merged

    def cols_binding(self) -> str:
        return self.cols_expr or f"{self.x}.shape[-1]"


def depends_on_inputs(graph: tuple[OpNode, ...]) -> set[str]:
    """Refs of nodes computed (transitively) from an input or parameter: the rest are constants the
    forward builds from nothing (a causal mask)."""
    live: set[str] = set()
    for n in graph:
        refs = [a for a in list(n.args) + [v for _, v in n.kwargs] for a in (a if isinstance(a, tuple) else (a,))
                if is_ref(a)]
        if any(r.startswith(("in", "param")) or r.split(".")[0] in live for r in refs):
            live.add(n.out)
    return live


def match_softmax(problem: Problem) -> SoftmaxMatch | str:
    g = problem.graph
    found = [i for i, n in enumerate(g) if n.op in SOFTMAX_OPS]
    if len(found) != 1:
        return "not one softmax or log-softmax over the last dim"
    node = g[found[0]]
    if len(node.args) > 2 and node.args[2] is True:
        return "softmax with an output dtype change (half_to_float)"
    live = depends_on_inputs(g)
    before = tuple(n for n in g[: found[0]] if n.out in live)
    after = g[found[0] + 1:]
    merged = _merged_dims(problem, before, node, after)
    x = before[0].args[0] if before else node.args[0]
    spec = leaf_spec(problem, x) if is_ref(x) else None
    if spec is None or spec.dtype not in CTYPES or len(spec.shape) < 1:
        return "the softmax's chain does not start at an fp32 or fp16 input"
    full = tuple(spec.shape)
    if merged is None and tuple(node.shape) != full:
        return "the ops before the softmax change the shape"
    k = merged if merged is not None else len(full) - 1  # the row is the input's dims from k on
    cols = math.prod(full[k:])
    rows = spec.numel // max(cols, 1)
    if rows >= 2**31 or cols >= 2**31 or cols == 0:
        return "rows and columns must fit in 32-bit ints (and a row must not be empty)"
    if merged is None:
        pro = compile_chain(problem, before, x, full, spec.dtype, allow_rowsum=False, prefix="p", result=node.args[0],
                             ends_inside=True)
        if isinstance(pro, str):
            return f"before the softmax: {pro}"
        epi = compile_chain(problem, after, node.out, full, spec.dtype, allow_rowsum=False)
    else:  # the view before is the rows, the view after the output: the chain after them, by flat index
        pro = Epilogue(prefix="p")
        epi = compile_chain(problem, after[1:], after[0].out, full, spec.dtype, allow_rowsum=False, flat=True)
    if isinstance(epi, str):
        return f"after the softmax: {epi}"
    out = problem.outputs[0].dtype if problem.outputs else ""
    if out != spec.dtype:
        return f"the output dtype {out} is not the input's {spec.dtype}"
    cols_expr = "" if merged is None else " * ".join(f"{x}.shape[{d}]" for d in range(k, len(full)))
    return SoftmaxMatch(x, spec.dtype, out, SOFTMAX_OPS[node.op], rows, cols, pro, epi, node.op in SAFE_OPS, cols_expr)


def _merged_dims(problem: Problem, before: tuple[OpNode, ...], node: OpNode, after: tuple[OpNode, ...]) -> int | None:
    """k when the softmax runs over a view of an input that merges its dims from k on into one (x.view(b, c,
    -1), softmax over dim 2: the spatial softmax of KernelBench level2/38) and its result is viewed straight
    back to the input's shape: the rows are then the input's memory as it is. None otherwise."""
    views = ("view", "reshape", "_unsafe_view")
    if len(before) != 1 or before[0].op not in views or node.args[0] != before[0].out or not after \
            or after[0].op not in views or after[0].args[0] != node.out:
        return None
    view, x = before[0], before[0].args[0]
    spec = leaf_spec(problem, x) if is_ref(x) and not x.endswith(".T") else None
    if spec is None:
        return None
    full, k = tuple(spec.shape), len(view.shape) - 1
    if not 1 <= k < len(full) - 1 or tuple(view.shape[:k]) != full[:k] or view.shape[-1] != math.prod(full[k:]) \
            or tuple(after[0].shape) != full:
        return None
    return k


@family(120)
class SoftmaxRows(Family):
    """One warp or one block per row: an online (max, sum) pass with shuffle reductions, values kept
    in registers (ITEMS vectors per thread) or re-read for the output pass; 16-byte vectors where
    the row is aligned."""

    def __init__(self) -> None:
        super().__init__("softmax_rows", {"GROUP": ("warp", "block"), "BLOCK": (64, 128, 256, 512, 1024),
                                          "VEC": (1, 2, 4, 8), "ITEMS": (0, 1, 2, 4, 8, 16)})

    def supports(self, problem: Problem) -> str | None:
        found = match_softmax(problem)
        return found if isinstance(found, str) else None

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        f = match_softmax(problem)
        if isinstance(f, str):
            return False
        width = per_16_bytes(f.in_dtype)
        return c["VEC"] <= width and c["ITEMS"] * c["VEC"] <= MAX_CACHED

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        f = match_softmax(problem)
        assert not isinstance(f, str)
        vec = per_16_bytes(f.in_dtype)

        def items(threads: int) -> int:  # vectors per thread to cache the whole row (0 if too many)
            need = -(-f.cols // (threads * vec))
            fit = next((i for i in self.knobs["ITEMS"] if i >= need), 0)
            return fit if fit * vec <= MAX_CACHED else 0

        block = 1024 if f.cols >= 16384 else 512 if f.cols >= 4096 else 256
        out = [dict(GROUP="warp", BLOCK=128, VEC=vec, ITEMS=items(32)), dict(GROUP="warp", BLOCK=256, VEC=vec, ITEMS=items(32)),
               dict(GROUP="block", BLOCK=block, VEC=vec, ITEMS=items(block)), dict(GROUP="block", BLOCK=block, VEC=vec, ITEMS=0)]
        if f.cols > 32 * vec * 16:  # a warp cannot hold the row: the block variants lead
            out = out[2:] + [dict(GROUP="block", BLOCK=max(256, block // 2), VEC=vec, ITEMS=items(max(256, block // 2)))]
        return [c for c in out if self.valid(c, problem)]

    def extra(self, problem: Problem) -> dict[str, Any]:
        f = match_softmax(problem)
        assert not isinstance(f, str)
        return {"LOG": f.log, "SAFE": f.safe, "T": CTYPES[f.in_dtype], "PRO": f.prologue, "EPI": f.epilogue}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        f = match_softmax(problem)
        assert not isinstance(f, str)
        grid = f"(cdiv(rows, {c['BLOCK'] // 32}),)" if c["GROUP"] == "warp" else "(rows,)"
        return LaunchSpec(entry=self.name, grid=grid, block=f"({c['BLOCK']},)",
                          args=(f.x, "out0", "rows", "cols", *f.prologue.launch_args(), *f.epilogue.launch_args()),
                          outputs=((f"{f.x}.shape", f.out_dtype),),
                          bindings=(("cols", f.cols_binding()), ("rows", f"{f.x}.numel() // max(cols, 1)")))
