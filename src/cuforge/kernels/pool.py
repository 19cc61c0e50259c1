"""Max and average pooling over 1-3 spatial dims of an NC... fp32 tensor (kernel, stride, padding,
dilation, count_include_pad from the trace; 1-d pooling is traced as 2-d over an unsqueezed dim; unit
dims added before it and dropped after it, as a GEMM's features pooled as (N, 1, 1, F), move no memory),
NaN propagating through max as in PyTorch. Every case is handled as 3-d with unit leading dims.

A thread computes RH consecutive output rows x RW output columns (BX apart: a warp's loads stay
consecutive); the input rows its RH rows' windows share are read once per column and reduced along
W first (both reductions are separable), and blocks index (plane, depth, row group) with no 64-bit
division per element: the one-thread-per-output kernel this replaces ran at 0.28-0.57 of the copy
bandwidth on KernelBench's max pooling files, bound by its index arithmetic and its loads."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from cuforge.kernels.base import GraphFamily
from cuforge.kernels.chains import CTYPES
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec
from cuforge.kernels.registry import family

POOLS = {"max_pool2d_with_indices": ("max", 2), "max_pool3d_with_indices": ("max", 3), "max_pool2d": ("max", 2),
         "max_pool3d": ("max", 3), "avg_pool2d": ("avg", 2), "avg_pool3d": ("avg", 3)}


@dataclass(frozen=True)
class PoolMatch:
    kind: str  # max | avg
    planes: int  # N * C
    size: tuple[int, int, int]  # input D, H, W
    out: tuple[int, int, int]
    kernel: tuple[int, int, int]
    stride: tuple[int, int, int]
    padding: tuple[int, int, int]
    dilation: tuple[int, int, int]
    count_pad: bool
    dtype: str = "float32"  # the input's and the output's


def _triple(v: Any, nd: int, default: int | None = None) -> tuple[int, ...] | None:
    if v is None or v == () or v == []:
        return None if default is None else (default,) * nd
    vals = tuple(v) if isinstance(v, (list, tuple)) else (v,)
    if len(vals) == 1:
        vals = vals * nd
    if len(vals) != nd or not all(isinstance(x, int) and not isinstance(x, bool) for x in vals):
        return None
    return vals


def unsqueezes_from_input(graph: tuple[Any, ...] | list[Any], src: str) -> list[Any] | None:
    """The unsqueezes that make `src` from in0, first first ([] when it is in0), or None if it is made
    any other way."""
    by_out = {n.out: n for n in graph}
    views = []
    while src != "in0":
        n = by_out.get(src)
        if n is None or n.op != "unsqueeze":
            return None
        views.append(n)
        src = n.args[0]
    return views[::-1]


def squeezes_of(rest: list[Any], node: Any) -> tuple[str, ...] | None:
    """The names the pooled values may go by after the squeezes `rest` applies to them (the node's own
    where none does), or None where `rest` holds anything else (squeezes of the unused indices aside)."""
    values, left = {node.out, f"{node.out}.0"}, list(rest)
    last = ""
    while left:
        n = next((m for m in left if m.op == "squeeze" and m.args[0] in values | {f"{node.out}.1"}), None)
        if n is None:
            return None
        left.remove(n)
        if n.args[0] == f"{node.out}.1":
            continue
        values.add(n.out)
        last = n.out
    return (last,) if last else (node.out, f"{node.out}.0")


def match_pool(problem: Problem) -> PoolMatch | str:
    g = problem.graph
    if len(problem.inputs) != 1 or problem.inputs[0].dtype not in CTYPES:
        return "needs one fp32, fp16 or bf16 input"
    dtype = problem.inputs[0].dtype
    node = next((n for n in g if n.op in POOLS), None)
    if node is None:
        return "no max or average pooling"
    kind, nd = POOLS[node.op]
    shape = tuple(problem.inputs[0].shape)
    # The pooled tensor is the input, or the input with unit dims inserted (1-d pooling is traced as 2-d
    # over unsqueeze(x, -2); a GEMM's features pooled as (N, 1, 1, F)): the same memory either way.
    views = unsqueezes_from_input(g, node.args[0])
    if views is None:
        return "the pooled tensor is not the input (or the input with unit dims inserted)"
    if views:
        shape = tuple(views[-1].shape)
    rest = [n for n in g if n is not node and n not in views]
    if len(shape) != nd + 2:
        return f"a {nd}-d pooling of a {len(shape) - 2}-d input"
    a = list(node.args) + [None] * 8
    kernel = _triple(a[1], nd)
    stride = _triple(a[2], nd) or kernel
    padding = _triple(a[3], nd, 0)
    if kind == "max":
        dilation, ceil, count_pad, divisor = _triple(a[4], nd, 1), a[5] or False, True, None
    else:
        dilation, ceil = (1,) * nd, a[4] or False
        count_pad = True if a[5] is None else a[5]
        divisor = a[6]
    if kernel is None or stride is None or padding is None or dilation is None:
        return "pooling sizes that are not constants"
    if ceil or divisor is not None:
        return "ceil_mode or divisor_override"
    if any(p * 2 > k for p, k in zip(padding, kernel)):
        return "padding larger than half the kernel"
    size = shape[2:]
    out = tuple((s + 2 * p - d * (k - 1) - 1) // st + 1 for s, p, d, k, st in zip(size, padding, dilation, kernel, stride))
    want = (shape[0], shape[1]) + out
    outs = problem.outputs
    if len(outs) != 1 or outs[0].dtype != dtype or math.prod(outs[0].shape) != math.prod(want) or min(out) <= 0:
        return "the output is not the pooled values"
    values = squeezes_of(rest, node)
    if values is None:
        return "an op other than squeezes beside the pooling"
    if len(problem.graph_outputs) != 1 or problem.graph_outputs[0] not in values:
        return "the forward's output is not the pooled values"
    def as_3d(t: tuple[int, ...], fill: int) -> tuple[int, int, int]:  # leading unit dims
        return (fill,) * (3 - nd) + tuple(t)  # type: ignore[return-value]

    return PoolMatch(kind, shape[0] * shape[1], as_3d(size, 1), as_3d(out, 1), as_3d(kernel, 1), as_3d(stride, 1),
                     as_3d(padding, 0), as_3d(dilation, 1), bool(count_pad), dtype)


def row_users(rh: int, stride: int, kernel: int, dilation: int) -> list[list[int]]:
    """For each input row r (from a row group's first window row), which of its rh output rows use it."""
    span = (rh - 1) * stride + (kernel - 1) * dilation + 1
    return [[j for j in range(rh) if any(j * stride + t * dilation == r for t in range(kernel))] for r in range(span)]


@family(220)
class Pool(GraphFamily):
    """A thread per RH x RW outputs; blocks of BX x TY threads (TY row groups side by side). VEC 4: a
    thread's RW columns are consecutive and its windows' span of a row is read as aligned float4s
    (rows of a multiple of 4 and RW x stride a multiple of 4); VEC 1: its columns are BX apart."""

    # A config stored before these knobs ({"BLOCK": 256}) renders as one output a thread, 256 threads wide.
    DEFAULTS: ClassVar[dict[str, Any]] = {"BX": 256, "TY": 1, "RW": 1, "RH": 1, "VEC": 1}

    def __init__(self) -> None:
        super().__init__("pool", {"BX": (8, 16, 32, 64, 128, 256), "TY": (1, 2, 4, 8, 16), "RW": (1, 2, 4, 8),
                                  "RH": (1, 2, 4), "VEC": (1, 4)})

    def match(self, problem: Problem) -> PoolMatch | str:
        return match_pool(problem)

    def valid(self, config: dict[str, Any], problem: Problem) -> bool:
        m = self.matched(problem)
        c = self.complete(config)
        groups = m.planes * m.out[0] * -(-m.out[1] // c["RH"])
        # float4 loads: fp32 only (a half tensor's windows are read one element at a time)
        vec_ok = c["VEC"] == 1 or (m.dtype == "float32" and m.size[2] % 4 == 0 and c["RW"] * m.stride[2] % 4 == 0)
        blocks = -(-groups // c["TY"]) * -(-m.out[2] // (c["BX"] * c["RW"]))
        return vec_ok and 32 <= c["BX"] * c["TY"] <= 1024 and blocks < 2**31 and c["RH"] * c["RW"] <= 16

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        m = self.matched(problem)
        oh = m.out[1]
        # Rows shared by neighbouring output rows' windows are worth reading once: 4 output rows of a
        # 4x4 stride-1 window read 7 input rows, not 16.
        used = sum(1 for users in row_users(2, m.stride[1], m.kernel[1], m.dilation[1]) if users)
        shared = oh > 1 and used < 2 * m.kernel[1]
        rh = 4 if shared and m.stride[1] == 1 else 2 if shared else 1
        out = []
        # Consecutive columns in float4s: as many a thread as keep its row span to 64 values.
        span = lambda r: (r - 1) * m.stride[2] + (m.kernel[2] - 1) * m.dilation[2] + 1  # noqa: E731
        vec_rw = [r for r in (8, 4, 2) if r * m.stride[2] % 4 == 0 and r * rh <= 16 and span(r) <= 64]
        if m.size[2] % 4 == 0 and vec_rw:
            bx, rw = self._row_of_threads(m.out[2], (8, 16, 32, 64, 128, 256), vec_rw[:2])
            ty = max(1, min(16, 128 // bx))
            out += [dict(BX=bx, TY=ty, RW=rw, RH=rh, VEC=4),
                    dict(BX=bx, TY=ty, RW=rw, RH=1, VEC=4) if rh > 1 else dict(BX=bx, TY=min(16, ty * 2), RW=rw, RH=1, VEC=4),
                    dict(BX=min(256, bx * 2), TY=max(1, ty // 2), RW=rw, RH=rh, VEC=4)]
            if 4 in vec_rw:  # a float4 of outputs a thread, 64 columns a row of threads: fastest on both 3-d files
                # (1.56 vs 1.89 ms, 3.39 vs 3.63: kb_s22_probe1; against the first seed 1.56 vs 2.92 and 3.40 vs
                # 5.54: kb_s22_pool), slower on the 1-d and 2-d ones (2.41 vs 2.15, 1.92 vs 1.45): first for 3-d pools.
                out.insert(0 if m.kernel[0] > 1 else 1, dict(BX=16, TY=8, RW=4, RH=1, VEC=4))
        bx, rw = self._row_of_threads(m.out[2], (32, 64, 128, 256), (1, 2, 4))
        ty = max(1, min(8, 256 // bx))
        scalar = [dict(BX=bx, TY=ty, RW=rw, RH=rh, VEC=1), dict(BX=bx, TY=ty, RW=1, RH=rh, VEC=1),
                  dict(BX=bx, TY=ty, RW=rw, RH=1 if rh > 1 else 2 if oh > 1 else 1, VEC=1)]
        # Windows side by side along the row (stride >= window): no value is shared by a thread's
        # outputs, and float4s spread a warp's loads thin. KernelBench's 11 x 11 stride-11 average pool:
        # 6.0-6.2 ms one column a thread against 10.4-11.7 ms with float4s (kb_s22_pool).
        apart = m.stride[2] >= (m.kernel[2] - 1) * m.dilation[2] + 1
        out = scalar + out if apart else out + scalar
        seen: list[dict[str, Any]] = []
        for c in out:
            if c not in seen and self.valid(c, problem):
                seen.append(c)
        return seen[:5]

    @staticmethod
    def _row_of_threads(ow: int, widths: tuple[int, ...], per_thread: Any) -> tuple[int, int]:
        """The widest row of threads (most columns per thread first) that leaves few of `ow` columns
        idle: 511 columns take 128 x 4, 65523 take 256 x 4, 62 take 32 x 2."""
        shapes = [(b, r) for b in widths for r in per_thread if b * r <= 1024]
        idle = {br: -(-ow // (br[0] * br[1])) * br[0] * br[1] - ow for br in shapes}
        allowed = max(0.02 * ow, min(idle.values()))
        return max((br for br in shapes if idle[br] <= allowed), key=lambda br: (br[0] * br[1], br[1]))

    def extra(self, problem: Problem) -> dict[str, Any]:
        m = self.matched(problem)
        users = {rh: row_users(rh, m.stride[1], m.kernel[1], m.dilation[1]) for rh in self.knobs["RH"]}
        return {"KIND": m.kind, "P": m, "USES_BY_RH": users, "CTYPE": CTYPES[m.dtype]}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        m = self.matched(problem)
        groups = m.planes * m.out[0] * -(-m.out[1] // c["RH"])
        return LaunchSpec(entry=self.name, grid=f"(cdiv({groups}, {c['TY']}) * cdiv({m.out[2]}, {c['BX'] * c['RW']}),)",
                          block=f"({c['BX']}, {c['TY']})", args=("in0", "out0"),
                          outputs=((repr(tuple(problem.outputs[0].shape)), m.dtype),))
