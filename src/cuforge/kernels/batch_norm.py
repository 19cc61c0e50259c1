"""Batch norm with training statistics (nn.BatchNorm1d/2d/3d in train mode, as KernelBench runs it)
over an (N, C, ...) fp32, fp16 or bf16 input (statistics in double, the output in the input's dtype), with its per-channel affine and an elementwise chain after it: a
statistics pass (C x SPLIT blocks, double-precision partial sums added atomically per channel), a
tiny pass turning them into per-channel mean and scale, then one elementwise pass that writes
(x - mean) * scale + bias through the chain. The running-statistics update is a side effect on
buffers, not an output, and is not reproduced."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cuforge.kernels.base import SEED_SMS, GraphFamily
from cuforge.kernels.chains import CTYPES, DTYPE_NAMES, Epilogue, compile_chain, per_16_bytes
from cuforge.kernels.leaves import leaf_spec
from cuforge.op_graph import OpNode, is_ref
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec
from cuforge.kernels.registry import family


@dataclass(frozen=True)
class BatchNormMatch:
    n: int
    c: int
    span: int  # the elements of one channel within one sample (H * W ...)
    eps: float
    weight: str | None
    bias: str | None
    epilogue: Epilogue
    dtype: str = "float32"  # the input's, the affine's and the output's


def _live(problem: Problem) -> tuple[OpNode, ...]:
    """The graph without nodes nothing reads: meta placeholders, and the in-place
    num_batches_tracked += 1 on a buffer. The set of values read is made once: per node, it made
    matching a traced RNN (40k nodes) take many minutes."""
    used = {a.partition(".")[0] for n in problem.graph for a in n.args if is_ref(a)} | \
        {o.partition(".")[0] for o in problem.graph_outputs if o is not None}

    def dead(node: OpNode) -> bool:
        return node.out not in used and (node.op == "empty" or (
            node.op.endswith("_") and bool(node.args) and is_ref(node.args[0]) and str(node.args[0]).startswith("param")))

    return tuple(n for n in problem.graph if not dead(n))


def match_batch_norm(problem: Problem, dtypes: tuple[str, ...] = ("float32",)) -> BatchNormMatch | str:
    """The problem as a training-mode batch norm with a chain after it, its input one of `dtypes`."""
    names = "/".join(DTYPE_NAMES[d] for d in dtypes)
    if len(problem.inputs) != 1 or problem.inputs[0].dtype not in dtypes or len(problem.inputs[0].shape) < 2:
        return f"needs one {names} input of at least 2 dims"
    dtype = problem.inputs[0].dtype
    shape = tuple(problem.inputs[0].shape)
    graph = _live(problem)
    if not graph or graph[0].op != "native_batch_norm" or graph[0].args[0] != "in0":
        return "does not start with a batch norm of the input"
    bn = graph[0]
    _, w, b, _, _, training, _, eps = (list(bn.args) + [None] * 8)[:8]
    if training is not True or not isinstance(eps, (int, float)):
        return "a batch norm with running statistics (eval mode) or without a constant eps"
    c = shape[1]
    for ref in (w, b):
        spec = leaf_spec(problem, ref) if is_ref(ref) else None
        if ref is not None and (spec is None or spec.dtype != dtype or tuple(spec.shape) != (c,)):
            return "a batch norm whose affine is not two per-channel parameters of the input's dtype"
    if len(problem.outputs) != 1 or tuple(problem.outputs[0].shape) != shape or problem.outputs[0].dtype != dtype:
        return "the output must have the input's shape and dtype"
    epi: Epilogue | str = "no output"
    for anchor in (bn.out, f"{bn.out}.0"):
        epi = compile_chain(problem, graph[1:], anchor, shape, dtype, channels=True, casts=dtype != "float32")
        if not isinstance(epi, str):
            break
    if isinstance(epi, str):
        return epi
    span = math.prod(shape[2:])
    if shape[0] * span >= 2**40:
        return "too many elements per channel"
    return BatchNormMatch(shape[0], c, span, float(eps), w, b, epi, dtype)


def template_values(m: BatchNormMatch) -> dict[str, Any]:
    """What a batch norm template needs of the match (batch_norm's and batch_norm_team's)."""
    return {"M": m, "EPS": repr(m.eps) + "f", "EPI": m.epilogue, "AFFINE_W": m.weight is not None,
            "AFFINE_B": m.bias is not None, "CTYPE": CTYPES[m.dtype]}


@family(270)
class BatchNorm(GraphFamily):
    """Statistics: SPLIT blocks per channel, BLOCK threads, VEC-wide loads where a channel's span allows
    (16 bytes: 4 fp32 or 8 fp16/bf16 elements); the write pass: a grid-stride loop over VEC-wide vectors."""

    anchors = frozenset({"native_batch_norm"})  # the graph's first live op

    def __init__(self) -> None:
        super().__init__("batch_norm", {"BLOCK": (256, 512, 1024), "VEC": (1, 4, 8), "WAVES": (1, 2, 4)})

    def match(self, problem: Problem) -> BatchNormMatch | str:
        return match_batch_norm(problem, tuple(CTYPES))

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        m = self.matched(problem)
        return c["VEC"] == 1 or (c["VEC"] == per_16_bytes(m.dtype) and m.span % c["VEC"] == 0)

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        m = self.matched(problem)
        vec = per_16_bytes(m.dtype) if m.span % per_16_bytes(m.dtype) == 0 else 1
        return [dict(BLOCK=512, VEC=vec, WAVES=2), dict(BLOCK=256, VEC=vec, WAVES=4), dict(BLOCK=1024, VEC=vec, WAVES=1)]

    @staticmethod
    def stat_blocks(c: dict[str, Any], m: BatchNormMatch) -> int:
        """Blocks per channel in the statistics pass: about WAVES blocks per multiprocessor in all."""
        per_channel = m.n * m.span // c["VEC"]
        return max(1, min(-(-SEED_SMS * c["WAVES"] * 2048 // c["BLOCK"] // m.c), -(-per_channel // c["BLOCK"])))

    def extra(self, problem: Problem) -> dict[str, Any]:
        return template_values(self.matched(problem))

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        m = self.matched(problem)
        affine = tuple(r for r in (m.weight, m.bias) if r is not None)
        vectors = m.n * m.c * m.span // c["VEC"]
        write_grid = f"(max(1, min(cdiv({vectors}, {c['BLOCK']}), SMS * {c['WAVES'] * 2048 // c['BLOCK']})),)"
        return LaunchSpec(
            entry=self.name, grid=write_grid, block=f"({c['BLOCK']},)",
            args=("in0", "out0", "scratch1", *affine, *m.epilogue.launch_args()),
            outputs=(("in0.shape", m.dtype),),
            bindings=(("SMS", "torch.cuda.get_device_properties(in0.device).multi_processor_count"),),
            scratch=((f"({2 * m.c},)", "float64", "zeros"), (f"({2 * m.c},)", "float32", "empty")),
            pre=((f"{self.name}_stats", f"({m.c}, {self.stat_blocks(c, m)})", f"({c['BLOCK']},)", "(in0, scratch0)"),
                 (f"{self.name}_coef", f"(cdiv({m.c}, 128),)", "(128,)", f"(scratch0, scratch1{''.join(', ' + a for a in affine)})")))
