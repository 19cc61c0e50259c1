"""Reductions over one dim (or a run of adjacent dims): sum, mean, max, min, argmax, argmin, logsumexp of an fp32,
fp16 or bf16 tensor seen as (outer, R, inner), computed in fp32 (sums in fp64) and stored in its dtype, then the elementwise ops the forward applies to the reduced values
(min over channels then tanh; a global average pool, mean over the trailing dims, then squeezes).
Threads run across `inner`, so every load of a warp is one contiguous stretch; where the dims reduced
are the last ones (inner = 1) a block takes a row instead. A single reduction over the last dim alone
without keepdim is reduce_rows'."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cuforge.kernels.base import GraphFamily
from cuforge.kernels.chains import CTYPES, Epilogue, compile_chain
from cuforge.op_graph import OpNode, constant_dims, is_ref
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec
from cuforge.kernels.registry import family

REDUCTIONS = ("sum", "mean", "max", "min", "amax", "amin", "argmax", "argmin", "logsumexp")
# Views that only regroup the reduced values (squeezing the kept dims): the stored order is theirs.
TAIL_VIEWS = ("view", "reshape", "_unsafe_view", "squeeze", "unsqueeze", "flatten")


@dataclass(frozen=True)
class DimReduction:
    op: str  # sum | mean | max | min | argmax | argmin | logsumexp
    outer: int
    reduced: int
    inner: int
    chain: Epilogue = Epilogue()  # elementwise ops on each reduced value before the store
    cols: int = 1  # the reduced tensor's last dim: where the chain's per-row / per-column operands change
    dtype: str = "float32"  # the input's and (values, not indices) the output's


def _split_tail(problem: Problem) -> tuple[tuple[OpNode, ...], str] | str:
    """The elementwise nodes after the reduction and the ref the forward returns, the views it takes of
    the chain's end skipped; or why the graph after the reduction is not that."""
    g = problem.graph
    value = g[0].out
    end = len(g)
    while end > 1 and g[end - 1].op in TAIL_VIEWS:
        end -= 1
    chain = g[1:end]
    last = chain[-1].out if chain else value
    for view in g[end:]:
        if view.args[0] not in (last, f"{last}.0"):
            return f"{view.op} of something other than the reduction's result"
        last = view.out
    if problem.graph_outputs not in ((last,), (f"{last}.0",)):
        return "the forward's output is not the reduction's value (or the chain after it)"
    return chain, value


def match_dim_reduction(problem: Problem) -> DimReduction | str:
    """The forward as one reduction over adjacent dims of its fp32 input, then elementwise ops on the
    reduced values, or why it is not."""
    g = problem.graph
    if not g or g[0].op not in REDUCTIONS:
        return f"not a single {', '.join(REDUCTIONS)} over a dim"
    node = g[0]
    dtype = problem.inputs[0].dtype if problem.inputs else None
    if dtype not in CTYPES or node.args[0] != "in0":
        return "needs the reduction of an fp32, fp16 or bf16 input"  # other inputs only as the chain's operands
    tail = _split_tail(problem)
    if isinstance(tail, str):
        return tail
    chain_nodes, value = tail
    if node.kwarg("dtype") is not None:
        return "a reduction with a dtype= conversion"
    shape = tuple(problem.inputs[0].shape)
    dim_arg = node.args[1] if len(node.args) > 1 else node.kwarg("dim")
    dims = constant_dims(dim_arg, len(shape)) if dim_arg is not None and not is_ref(dim_arg) else None
    if dims is None:
        return "no constant dim (a full reduction)"
    if dims != tuple(range(dims[0], dims[-1] + 1)):
        return "reduced dims are not adjacent"
    outer, reduced, inner = (math.prod(shape[: dims[0]]), math.prod(shape[dims[0]: dims[-1] + 1]),
                             math.prod(shape[dims[-1] + 1:]))
    op = {"amax": "max", "amin": "min"}.get(node.op, node.op)
    if 1 < inner < 8:
        return "over nearly the last dims (a few columns a row): no kernel here"
    if inner == 1 and op.startswith("arg"):
        return f"{op} over the last dims: reduce_rows' case"
    chain = Epilogue()
    if chain_nodes:
        if op.startswith("arg"):
            return f"{chain_nodes[0].op} after {op}: the chain computes on values, not indices"
        compiled = compile_chain(problem, chain_nodes, value, tuple(node.shape), dtype=dtype, allow_rowsum=False,
                                 result=chain_nodes[-1].out, casts=dtype != "float32")
        if isinstance(compiled, str):
            return compiled
        chain = compiled
    want = "int64" if op in ("argmax", "argmin") else dtype
    out = problem.outputs[0] if len(problem.outputs) == 1 else None
    if out is None or out.dtype != want or math.prod(out.shape) != outer * inner:
        return f"needs one {want} output of {outer * inner} elements"
    if reduced == 0 or reduced >= 2**31 or outer * inner >= 2**40 or (inner == 1 and outer >= 2**31):
        return "empty or enormous"  # (a row a block: the grid's x dim holds 2^31 - 1 blocks)
    return DimReduction(op, outer, reduced, inner, chain, node.shape[-1] if node.shape else 1, dtype)


@family(160)
class ReduceDim(GraphFamily):
    """TX threads across the inner dim, TY down the reduced one, each keeping CHAINS partials (sums in
    double, max/min/arg with NaN and first-index-on-ties as torch), then a shared-memory combine. Over
    the last dims (inner = 1): a block of TX x TY threads a row, UNROLL float4 loads each in flight."""

    def __init__(self) -> None:
        super().__init__("reduce_dim", {"TX": (32, 64, 128, 256), "TY": (1, 2, 4, 8, 16, 32), "UNROLL": (1, 2, 4, 8),
                                        "CHAINS": (1, 2, 4)})

    DEFAULTS = {"CHAINS": 1}  # configs from before the knob

    def match(self, problem: Problem) -> DimReduction | str:
        return match_dim_reduction(problem)

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        if self.matched(problem).inner == 1:  # rows: only the block's size counts, one partial a thread
            return c["CHAINS"] == 1 and c["TY"] in (1, 2, 4, 8) and c["UNROLL"] > 1 and 128 <= c["TX"] * c["TY"] <= 1024
        return 64 <= c["TX"] * c["TY"] <= 1024

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        m = self.matched(problem)
        if m.inner == 1:
            return [dict(TX=256, TY=2, UNROLL=4, CHAINS=1), dict(TX=256, TY=1, UNROLL=4, CHAINS=1),
                    dict(TX=256, TY=4, UNROLL=4, CHAINS=1), dict(TX=128, TY=2, UNROLL=8, CHAINS=1)]
        # Few output columns: spread the reduced dim over more threads.
        ty = 16 if m.outer * m.inner < 64 * 1024 else 8
        # Big blocks first where the inner dim fills them: on (128, 4096, 4095) over dim 1 (H100), 128 x 8
        # threads with 4 loads each ran 3% faster than 64 x 8 (kb_s22_rd_probe), which ran 4% faster than
        # 64 x 4 and 12% faster than 8 loads a thread in flight (kb_s22_probe1).
        wide = [dict(TX=128, TY=8, UNROLL=4, CHAINS=1)] if m.inner >= 128 else []
        return wide + [dict(TX=64, TY=ty, UNROLL=4, CHAINS=1), dict(TX=128, TY=4, UNROLL=4, CHAINS=1), dict(TX=64, TY=4, UNROLL=2, CHAINS=2),
                       dict(TX=32, TY=ty, UNROLL=4, CHAINS=1), dict(TX=32, TY=ty, UNROLL=1, CHAINS=4), dict(TX=128, TY=2, UNROLL=8, CHAINS=1)]

    def extra(self, problem: Problem) -> dict[str, Any]:
        m = self.matched(problem)
        return {"OP": m.op, "OUT_T": "long long" if m.op.startswith("arg") else CTYPES[m.dtype], "CTYPE": CTYPES[m.dtype], "ROWS": m.inner == 1,
                "EPI": m.chain, "INDEXED": m.chain.indexed}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        m = self.matched(problem)
        out = problem.outputs[0]
        grid, block = ("(outer,)", f"({c['TX'] * c['TY']},)") if m.inner == 1 else \
            (f"(outer * cdiv(inner, {c['TX']}),)", f"({c['TX']}, {c['TY']})")
        return LaunchSpec(entry=self.name, grid=grid, block=block,
                          args=("in0", "out0", "reduced", "inner", "cols", *m.chain.launch_args()),
                          outputs=((repr(tuple(out.shape)), out.dtype),),
                          bindings=(("outer", str(m.outer)), ("reduced", str(m.reduced)), ("inner", str(m.inner)), ("cols", str(m.cols))))
