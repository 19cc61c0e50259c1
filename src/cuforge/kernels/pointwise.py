"""Pointwise chains: any forward made only of elementwise ops (activations written as one op or spelled
out with pow, tanh, exp, abs, div, ...; casts between floating dtypes) over tensors of the output's
shape and dtype (fp32, fp16 or bf16; the chain computes in fp32), with per-column or
per-row operands and constants, fused into one kernel that reads each input once and writes once.
Where no input has the output's shape (an outer sum: (N, 1) + (1, F, 1, 1) makes (1, F, N, 1), as
KernelBench level2/75 ends), every input is an operand read at its broadcast index, one element a
thread."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cuforge.kernels.base import GraphFamily, grid_stride_grid, sm_count
from cuforge.kernels.chains import CTYPES, ELEMENTWISE, Epilogue, compile_chain, per_16_bytes
from cuforge.kernels.leaves import LEAF_VIEWS, leaf_spec
from cuforge.kernels.vector_operands import VectorOperands, vector_operands
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec
from cuforge.kernels.registry import family


@dataclass(frozen=True)
class PointwiseMatch:
    anchor: str | None  # the input read as the chain's starting value (vector loads); None: all broadcast
    chain: Epilogue
    shape: tuple[int, ...] = ()  # the output's
    dtype: str = "float32"  # of the output, the anchor and every operand (the chain computes in fp32)


DTYPES = ("float32", "float16", "bfloat16")


def match_pointwise(problem: Problem) -> PointwiseMatch | str:
    """The forward as one pointwise chain, or why it is not one."""
    graph = problem.graph
    if not graph:
        return "no traced graph"
    # An eval-mode batch norm is a per-channel affine (compile_chain refuses one in training mode).
    odd = sorted({n.op for n in graph if n.op not in ELEMENTWISE + LEAF_VIEWS + ("_to_copy", "native_batch_norm", "empty",
                                                                                "slice", "cat", "stack")})
    if odd:
        return f"not only elementwise ops ({', '.join(odd)})"
    if len(problem.outputs) != 1 or problem.outputs[0].dtype not in DTYPES:
        return "needs one fp32, fp16 or bf16 output"
    dtype = problem.outputs[0].dtype
    full = tuple(problem.outputs[0].shape)
    if not full:
        return "a 0-dim output"
    anchor = next((f"in{i}" for i, x in enumerate(problem.inputs) if tuple(x.shape) == full and x.dtype == dtype), None)
    if anchor is None and (not problem.inputs or any(x.dtype != dtype for x in problem.inputs)):
        return f"no input of the output's shape and dtype ({dtype}), and inputs not all of it to broadcast"
    # Without an anchor the chain starts from nothing: every input is an operand at its broadcast index.
    chain = compile_chain(problem, graph, anchor or "<no anchor>", full, dtype, allow_rowsum=False, casts=True)
    if isinstance(chain, str):
        return chain
    if not chain.body:
        return "the forward returns its input unchanged"
    return PointwiseMatch(anchor, chain, full, dtype)


def operand_vectors(problem: Problem, m: PointwiseMatch, vec: int) -> VectorOperands | str:
    """The chain with its operands read once per vector of `vec` elements (knob OPVEC), or why not."""
    if m.anchor is None:
        return "no anchor: every input is read at its broadcast index"
    numels = []
    for ref, _ in m.chain.tensors:
        spec = leaf_spec(problem, ref)
        if spec is None:
            return f"{ref} is not an input or a parameter"
        numels.append(math.prod(spec.shape))
    return vector_operands(m.chain, vec, m.shape[-1], tuple(numels))


@family(150)
class PointwiseChain(GraphFamily):
    """A thread takes UNROLL vectors of VEC consecutive elements a step (float4 loads and stores of the
    anchor), grid-stride loop; row and column are only computed when an operand is per-row or per-column."""

    def __init__(self) -> None:
        super().__init__("pointwise", {"VEC": (1, 2, 4, 8), "BLOCK": (128, 256, 512, 1024), "WAVES": (1, 2, 4, 8, 16, 32, 0),
                                       "UNROLL": (1, 2, 4, 8), "OPVEC": (0, 1)})

    # Configs stored before a knob existed: one vector a thread a step; operands read element by element.
    DEFAULTS = {"UNROLL": 1, "OPVEC": 0}

    def match(self, problem: Problem) -> PointwiseMatch | str:
        return match_pointwise(problem)

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        m = self.matched(problem)
        if c["VEC"] > per_16_bytes(m.dtype):  # one load is at most 16 bytes
            return False
        if c.get("OPVEC", 0) and (c["VEC"] == 1 or isinstance(operand_vectors(problem, m, c["VEC"]), str)):
            return False
        return m.anchor is not None or c["VEC"] == 1  # no anchor: no vector to load

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        base = self._plain_seeds(problem)
        m = self.matched(problem)
        vectorized = [dict(c, OPVEC=1) for c in base if self.valid(dict(c, OPVEC=1), problem)]
        if not any(isinstance(v := operand_vectors(problem, m, c["VEC"]), VectorOperands) and v.vectors for c in vectorized):
            return base
        # Operands read as vectors lead; the element-by-element form of the first seed stays beside them.
        return [vectorized[0], base[0], *vectorized[1:2]]

    def _plain_seeds(self, problem: Problem) -> list[dict[str, Any]]:
        if self.matched(problem).anchor is None:
            return [dict(VEC=1, BLOCK=256, WAVES=0), dict(VEC=1, BLOCK=512, WAVES=8), dict(VEC=1, BLOCK=128, WAVES=0)]
        if self.matched(problem).dtype != "float32":  # 16-byte loads of eight fp16/bf16 elements
            return [dict(VEC=8, BLOCK=128, WAVES=0, UNROLL=2), dict(VEC=8, BLOCK=256, WAVES=0, UNROLL=1),
                    dict(VEC=4, BLOCK=256, WAVES=0, UNROLL=2)]
        # As the elementwise family's: eager's kernel shape first (two float4 a thread, 128 threads).
        return [dict(VEC=4, BLOCK=128, WAVES=0, UNROLL=2), dict(VEC=4, BLOCK=256, WAVES=0, UNROLL=4),
                dict(VEC=4, BLOCK=256, WAVES=0, UNROLL=1)]

    def extra(self, problem: Problem) -> dict[str, Any]:
        m = self.matched(problem)
        vops = {vec: v for vec in (2, 4, 8) if isinstance(v := operand_vectors(problem, m, vec), VectorOperands)}
        return {"EPI": m.chain, "INDEXED": m.chain.indexed, "OPS": " ".join(n.op for n in problem.graph), "VOPS": vops,
                "ANCHOR": m.anchor is not None, "COLS": m.shape[-1], "DTYPE": m.dtype, "CTYPE": CTYPES[m.dtype]}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        m = self.matched(problem)
        grid = grid_stride_grid(f"cdiv(n, {c['VEC'] * c['UNROLL']})", c["BLOCK"], c["WAVES"])
        if m.anchor is None:  # the output's shape is known from the trace alone
            shape, n, cols = repr(m.shape), str(math.prod(m.shape)), str(m.shape[-1])
        else:
            shape, n, cols = f"{m.anchor}.shape", f"{m.anchor}.numel()", f"{m.anchor}.shape[-1]"
        return LaunchSpec(entry=self.name, grid=grid, block=f"({c['BLOCK']},)",
                          args=(m.anchor or "in0", "out0", "n", "cols", *m.chain.launch_args()),
                          outputs=((shape, m.dtype),), bindings=(("n", n), ("cols", cols), sm_count(m.anchor or "in0")))
