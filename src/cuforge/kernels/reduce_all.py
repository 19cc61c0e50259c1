"""Whole-tensor reductions of an elementwise chain: losses and the like (MSE written out, Huber as
smooth_l1_loss, hinge, KL divergence spelled out with log and xlogy), i.e. the chain over fp32, fp16
or bf16 tensors of one shape (per-row / per-column operands allowed), summed or averaged to one value,
then scaled by constants. One kernel: grid-stride partial sums in double, one atomic per block, and
the last block to finish writes the value (in the inputs' dtype, rounded once)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cuforge.kernels.base import GraphFamily, grid_stride_grid, sm_count
from cuforge.kernels.chains import CTYPES, ELEMENT_AT, ELEMENTWISE, TO_FLOAT, Epilogue, compile_chain, literal, per_16_bytes
from cuforge.kernels.leaves import LEAF_VIEWS, leaf_spec
from cuforge.op_graph import OpNode, is_ref
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec
from cuforge.kernels.registry import family


@dataclass(frozen=True)
class ReduceAllMatch:
    anchor: str
    chain: Epilogue
    mean: bool
    post: str  # C statements on the reduced value `s`
    dtype: str = "float32"  # the inputs' and the output's


def _full_reduction(node: OpNode) -> str | None:
    """"sum" / "mean" for a reduction of every element (no dims, no dtype), else None."""
    if node.op not in ("sum", "mean") or node.shape != () or node.kwarg("dtype") is not None:
        return None
    return node.op if all(a is None or a == () for a in node.args[1:]) else None


def _huber(problem: Problem, node: OpNode, full: tuple[int, ...], dtype: str) -> tuple[Epilogue, bool] | str:
    """smooth_l1_loss(a, b, reduction, beta) as (the per-element chain, whether it is a mean)."""
    a, b = node.args[0], node.args[1] if len(node.args) > 1 else None
    reduction = node.args[2] if len(node.args) > 2 else node.kwarg("reduction", 1)
    beta = node.args[3] if len(node.args) > 3 else node.kwarg("beta", 1.0)
    specs = [leaf_spec(problem, x) if is_ref(x) else None for x in (a, b)]
    if a != "in0" or any(s is None or tuple(s.shape) != full or s.dtype != dtype for s in specs):
        return "smooth_l1_loss of other than two inputs of one shape and dtype"
    if reduction not in (1, 2) or is_ref(beta) or not isinstance(beta, (int, float)) or float(beta) <= 0:
        return "smooth_l1_loss without a mean or sum reduction and a positive constant beta"
    bt = literal(beta)
    other = TO_FLOAT.get(dtype, "{}").format(f"e0[{ELEMENT_AT}]")
    body = (f"const float d = v - {other};\nconst float ad = fabsf(d);\n"
            f"v = ad < {bt} ? 0.5f * d * d / {bt} : ad - 0.5f * {bt};")
    return Epilogue(body, ((b, "rc"),), ctype=CTYPES[dtype]), reduction == 1


def _post(nodes: list[OpNode], start: str) -> str | None:
    """Scalar ops by constants after the reduction, as C statements on `s`; None if something else."""
    lines, cur = [], start
    for n in nodes:
        if n.shape != () or not n.args or n.args[0] != cur or len(n.args) < 2 or is_ref(n.args[1]) \
                or not isinstance(n.args[1], (int, float)):
            return None
        k = literal(n.args[1])
        expr = {"div": f"s / {k}", "mul": f"s * {k}", "add": f"s + {k}", "sub": f"s - {k}"}.get(n.op)
        if expr is None or (n.op in ("add", "sub") and n.kwarg("alpha", 1) != 1) or n.kwarg("rounding_mode") is not None:
            return None
        lines.append(f"s = {expr};")
        cur = n.out
    return "\n".join(lines)


def match_reduce_all(problem: Problem) -> ReduceAllMatch | str:
    g = problem.graph
    if len(problem.outputs) != 1 or tuple(problem.outputs[0].shape) != () or problem.outputs[0].dtype not in CTYPES:
        return "needs one fp32, fp16 or bf16 scalar output"
    dtype = problem.outputs[0].dtype
    at = next((i for i, n in enumerate(g) if _full_reduction(n) or n.op == "smooth_l1_loss"), None)
    if at is None:
        return "no sum or mean of every element"
    red = g[at]
    anchor = next((f"in{i}" for i, x in enumerate(problem.inputs) if x.dtype == dtype and len(x.shape) >= 1
                   and all(len(y.shape) <= len(x.shape) for y in problem.inputs)), None)
    if anchor is None:
        return f"no {dtype} input to run over"
    full = tuple(problem.inputs[int(anchor[2:])].shape)
    if red.op == "smooth_l1_loss":
        if at != 0:
            return "ops before smooth_l1_loss"
        found = _huber(problem, red, full, dtype)
        if isinstance(found, str):
            return found
        chain, mean = found
    else:
        pre = g[:at]
        odd = sorted({n.op for n in pre if n.op not in ELEMENTWISE + LEAF_VIEWS})
        if odd:
            return f"not only elementwise ops before the reduction ({', '.join(odd)})"
        chain = compile_chain(problem, tuple(pre), anchor, full, dtype, allow_rowsum=False, result=red.args[0], ends_inside=True,
                              casts=dtype != "float32")
        if isinstance(chain, str):
            return chain
        mean = red.op == "mean"
    post = _post(list(g[at + 1:]), red.out)
    if post is None:
        return "after the reduction, more than scalar ops by constants"
    if problem.graph_outputs != ((g[-1].out,) if at + 1 < len(g) else (red.out,)):
        return "the forward's output is not the reduced value"
    return ReduceAllMatch(anchor, chain, mean, post, dtype)


@family(210)
class ReduceAll(GraphFamily):
    """A grid of a few waves, VEC-wide loads of the anchor (fp32: 1, 2 or 4; fp16/bf16: 1 or 8, a 16-byte
    load), per-thread double sums, a block reduction, one double atomic per block; the last block (by an
    atomic ticket) applies mean and scale."""

    def __init__(self) -> None:
        super().__init__("reduce_all", {"VEC": (1, 2, 4, 8), "BLOCK": (256, 512, 1024), "WAVES": (1, 2, 4, 8)})

    def match(self, problem: Problem) -> ReduceAllMatch | str:
        return match_reduce_all(problem)

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        half = self.matched(problem).dtype != "float32"
        return c["VEC"] in ((1, 8) if half else (1, 2, 4))

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        # KernelBench on the H100 (kb_bw_s37_reduce_all): level1/100 (4 GiB and a per-column operand) 1.453 ms
        # at 1024 x 8 waves, 1.463 at 512 x 8, 1.528 at 512 x 2 (the first seed before); level1/94 2.776,
        # 2.762, 2.790. More blocks, more loads in flight at once; still one atomic a block.
        vec = per_16_bytes(self.matched(problem).dtype)
        return [dict(VEC=vec, BLOCK=1024, WAVES=8), dict(VEC=vec, BLOCK=512, WAVES=8), dict(VEC=vec, BLOCK=512, WAVES=2)]

    def extra(self, problem: Problem) -> dict[str, Any]:
        m = self.matched(problem)
        return {"EPI": m.chain, "INDEXED": m.chain.indexed, "MEAN": m.mean, "POST": m.post, "CTYPE": CTYPES[m.dtype],
                "OPS": " ".join(n.op for n in problem.graph)}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        m = self.matched(problem)
        grid = grid_stride_grid(f"cdiv(n, {c['VEC']})", c["BLOCK"], c["WAVES"])  # WAVES > 0: few blocks, few atomics
        return LaunchSpec(entry=self.name, grid=grid, block=f"({c['BLOCK']},)",
                          args=(m.anchor, "out0", "n", "cols", "scratch0", "scratch1", *m.chain.launch_args()),
                          outputs=(("()", m.dtype),), scratch=(("(1,)", "float64", "zeros"), ("(1,)", "int32", "zeros")),
                          bindings=(("n", f"{m.anchor}.numel()"), ("cols", f"{m.anchor}.shape[-1]"),
                                    sm_count(m.anchor)))
