"""A row norm after a pointwise prologue, in one kernel: the pre-norm seam of a transformer block,
where the residual stream plus a sublayer's output is both returned (the new residual) and normalised
(RMSNorm or LayerNorm over the last dim, then the traced epilogue). Unfused, the add and the norm are
two kernels and the sum makes a round trip through memory; here each row is held in registers from
its loads to its stores. It takes a norm alone as well (an empty prologue), as a register-resident
alternative to norm_rows. fp32, fp16 or bf16, with the statistics, prologue and epilogue in fp32."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from cuforge.kernels.base import Family
from cuforge.kernels.chains import CTYPES, ELEMENT_AT, ELEMENTWISE, Epilogue, compile_chain, literal, per_16_bytes
from cuforge.kernels.leaves import leaf_spec
from cuforge.kernels.norms import FLOATS, NormMatch, match_norm
from cuforge.kernels.registry import family
from cuforge.op_graph import is_ref, renamed_node
from cuforge.problems.problem import Problem, TensorSpec
from cuforge.sandbox.protocol.candidate import LaunchSpec

# Threads that share one row, and the registers a thread may spend on its slice of the row (fp32
# values): beyond that a row is left to norm_rows, which re-reads it.
ROW_THREADS = (32, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
MAX_VALUES = 64


@dataclass(frozen=True)
class ResidualNormMatch:
    norm: NormMatch  # its x is the prologue's value (or the input itself where there is no prologue)
    anchor: str  # the input the prologue starts from (loaded as the chain's v)
    prologue: Epilogue  # the chain that makes the normalised value from the anchor (empty: the input itself)
    stores_sum: bool  # the prologue's value is also returned
    sum_first: bool  # ... as the first output (the norm's second)


def _norm_of(problem: Problem, k: int) -> tuple[NormMatch, str] | str:
    """The norm over graph[k:], reading graph[k - 1]'s value as a new input; (match, that value's ref)."""
    made = problem.graph[k - 1]
    dtype = problem.outputs[0].dtype
    leaf = f"in{len(problem.inputs)}"
    rest = tuple(renamed_node(n, {made.out: leaf}) for n in problem.graph[k:])
    outs = tuple(o for o in problem.graph_outputs if o != made.out)
    if len(outs) != 1 or not rest or outs[0] != rest[-1].out:
        return "the forward does not return the norm (and at most the value it normalises)"
    norm_out = next(s for o, s in zip(problem.graph_outputs, problem.outputs) if o == outs[0])
    sub = replace(problem, id=problem.id + "#norm", inputs=tuple(problem.inputs) + (TensorSpec(tuple(made.shape), dtype),),
                  graph=rest, graph_outputs=outs, outputs=(norm_out,), ops=tuple(n.op for n in rest))
    found = match_norm(sub)
    if isinstance(found, str):
        return found
    if found.x != leaf:
        return "the norm does not normalise the prologue's value"
    if leaf in (found.weight, found.bias) or any(ref == leaf for ref, _ in found.epilogue.tensors):
        return "the norm's epilogue reads the prologue's value again"
    return found, made.out


def match_residual_norm(problem: Problem) -> ResidualNormMatch | str:
    """A pointwise prologue over inputs of the output's shape and dtype, then a norm of its value over
    the last dim; the forward returns the norm's result and may also return the prologue's value."""
    g = problem.graph
    if not g or not problem.outputs:
        return "no traced graph"
    dtype = problem.outputs[0].dtype
    if dtype not in FLOATS or any(o.dtype != dtype for o in problem.outputs) or len(problem.outputs) > 2:
        return "needs one or two outputs, all fp32, fp16 or bf16 alike"
    plain = match_norm(problem)
    if not isinstance(plain, str):  # no prologue: the input itself, normalised
        return ResidualNormMatch(plain, plain.x, Epilogue(prefix="p", ctype=CTYPES[plain.dtype]), False, False)
    k = 0
    while k < len(g) and g[k].op in ELEMENTWISE:
        k += 1
    if k == 0:
        return f"neither a norm nor a pointwise prologue and a norm ({plain})"
    reasons = []
    for end in range(k, 0, -1):  # the longest prologue first: the most work in the one kernel
        found = _norm_of(problem, end)
        if isinstance(found, str):
            reasons.append(found)
            continue
        norm, made = found
        shape = tuple(g[end - 1].shape)
        first = g[0]
        anchors = [a for a in first.args[:2] if is_ref(a) and (s := leaf_spec(problem, a)) is not None
                   and tuple(s.shape) == shape and s.dtype == dtype]
        if not anchors:
            reasons.append("the prologue does not start from an input of the norm's shape and dtype")
            continue
        pro = compile_chain(problem, g[:end], anchors[0], shape, dtype, prefix="p", result=made, casts=True)
        if isinstance(pro, str):
            reasons.append(f"prologue: {pro}")
            continue
        outs = problem.graph_outputs
        return ResidualNormMatch(norm, anchors[0], pro, made in outs, bool(outs) and outs[0] == made)
    return reasons[0]


def _vectors(m: ResidualNormMatch) -> int:
    """16-byte vectors in a row (the last one may be short)."""
    w = per_16_bytes(m.norm.dtype)
    return -(-m.norm.cols // w)


@family(92)
class ResidualNorm(Family):
    """A pointwise prologue (a residual add) and a layernorm or rmsnorm of its value in one kernel: TPR
    threads a row, RPB rows a block, each thread's slice of the row (NV 16-byte vectors, strided by the
    row's threads) kept in registers between the statistics and the output; the prologue's value is
    stored as it is made where the forward returns it. A norm alone is the empty prologue's case."""

    anchors = frozenset({"native_layer_norm", "mean"})  # a layernorm's op, an rmsnorm's mean of squares

    def __init__(self) -> None:
        super().__init__("residual_norm", {"TPR": ROW_THREADS, "RPB": (1, 2, 4, 8)})

    def supports(self, problem: Problem) -> str | None:
        found = match_residual_norm(problem)
        return found if isinstance(found, str) else None

    def leads(self, problem: Problem) -> bool:
        # With a prologue, norm_rows does not cover the graph (a partition would cut it in two); a norm
        # alone stays norm_rows' first.
        found = match_residual_norm(problem)
        return not isinstance(found, str) and bool(found.prologue.body)

    def _nv(self, c: dict[str, Any], m: ResidualNormMatch) -> int:
        return -(-_vectors(m) // c["TPR"])

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        m = match_residual_norm(problem)
        if isinstance(m, str) or c["TPR"] * c["RPB"] > 1024:
            return False
        nv = self._nv(c, m)
        # Every thread of a row holds part of it (no thread idle for the whole row), within the registers.
        return c["TPR"] <= _vectors(m) and nv * per_16_bytes(m.norm.dtype) <= MAX_VALUES

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        m = match_residual_norm(problem)
        assert not isinstance(m, str)
        vectors, rows = _vectors(m), m.norm.rows
        # Rows split so that each thread holds a few vectors (two in a batch of under 1024 rows, where
        # more threads a row make up for the few rows; four otherwise) and none is idle, and rows
        # grouped into blocks of up to 256 threads while that leaves at least 264 blocks (two an SM).
        def waste(t: int) -> float:
            return (-(-vectors // t) * t - vectors) / vectors

        fits = [t for t in ROW_THREADS if self.valid(dict(TPR=t, RPB=1), problem)]
        ranked = sorted(fits, key=lambda t: (waste(t) > 0.05, abs(-(-vectors // t) - (2 if rows < 1024 else 4)), -t))
        out = []
        for t in ranked[:3]:
            rpb = 1
            while rpb < 8 and t * rpb * 2 <= 256 and -(-rows // (rpb * 2)) >= 264:
                rpb *= 2
            out.append(dict(TPR=t, RPB=rpb))
        return [c for c in out if self.valid(c, problem)]

    def extra(self, problem: Problem) -> dict[str, Any]:
        m = match_residual_norm(problem)
        assert not isinstance(m, str)
        pro = m.prologue
        # Operands of the row's shape are read as 16-byte vectors beside the anchor's, into registers.
        rc = [i for i, (_, how) in enumerate(pro.tensors) if how == "rc"]
        body = pro.body
        for i in rc:
            body = body.replace(f"{pro.prefix}{i}[{ELEMENT_AT}]", f"pv{i}[e]")
        n = m.norm
        return {"VECTORS": _vectors(m), "KIND": n.kind, "HAS_W": n.weight is not None, "HAS_B": n.bias is not None, "EPS": literal(n.eps),
                "EPI": n.epilogue, "PRO": pro, "PRO_BODY": body, "RC": rc,
                "PV_PARAMS": "".join(f", const T* pv{i}" for i in rc), "PV_ARGS": "".join(f", pv{i}" for i in rc),
                "PV_ALIGN": "".join(f" | reinterpret_cast<unsigned long long>(p{i})" for i in rc), "STORE_SUM": m.stores_sum,
                "DTYPE": n.dtype, "CTYPE": CTYPES[n.dtype]}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        m = match_residual_norm(problem)
        assert not isinstance(m, str)
        n = m.norm
        spec = (f"{m.anchor}.shape", n.dtype)
        outputs = (spec, spec) if m.stores_sum else (spec,)
        y, s = ("out1", "out0") if m.sum_first else ("out0", "out1" if m.stores_sum else "out0")
        return LaunchSpec(entry=self.name, grid=f"(cdiv(rows, {c['RPB']}),)", block=f"({c['TPR'] * c['RPB']},)",
                          args=(m.anchor, n.weight or m.anchor, n.bias or m.anchor, y, s, "rows", "cols",
                                *m.prologue.launch_args(), *n.epilogue.launch_args()),
                          outputs=outputs,
                          bindings=(("cols", f"{m.anchor}.shape[-1]"), ("rows", f"{m.anchor}.numel() // max(cols, 1)")))
