"""Kernel families: which problems each covers, its knobs, the constraints that prune invalid
configs before compiling, per-shape seed configs, and rendering a config into a format-B candidate
(one compiled config serves every shape: shapes are runtime arguments)."""

from __future__ import annotations

from typing import Any

from cuforge.kernels.base import SEED_SMS, SMEM_LIMIT, Family, config_of, could_match, fills_gpu, grid_stride_grid, sm_count, tiles  # noqa: F401
from cuforge.problems.problem import Problem
from cuforge.kernels.dropout import TorchDropout
from cuforge.kernels.inputs import unusual_tensors
from cuforge.kernels.pipeline import Pipeline
from cuforge.kernels.partition import LIBRARY_ATEN, LIBRARY_OPS
from cuforge.kernels.partition_family import Partition
from cuforge.kernels.registry import family, registered
from cuforge.kernels.staged import Staged, staged_families
from cuforge.sandbox.protocol.candidate import LaunchSpec
from cuforge.sandbox.protocol.precision import tf32_allowed


ELEMENTWISE_OPS = ("relu", "gelu", "gelu_tanh", "silu", "sigmoid")


@family(100)
class Elementwise(Family):
    """One activation over a tensor: 16-byte vector accesses where the width allows, UNROLL vectors a
    thread a step, grid-stride loop with a grid capped at a number of waves over the SMs."""

    def __init__(self) -> None:
        super().__init__("elementwise", {"VEC": (1, 2, 4, 8), "BLOCK": (128, 256, 512, 1024), "WAVES": (1, 2, 4, 8, 16, 32, 0),
                                         "UNROLL": (1, 2, 4, 8)})

    DEFAULTS = {"UNROLL": 1}  # vectors a thread loads per step: configs stored before the knob loaded one

    def supports(self, problem: Problem) -> str | None:
        if len(problem.ops) != 1 or problem.ops[0] not in ELEMENTWISE_OPS:
            return f"not a single activation of {', '.join(ELEMENTWISE_OPS)}"
        if len(problem.inputs) != 1 or problem.inputs[0].dtype not in ("float32", "float16", "bfloat16"):
            return "needs one fp32, fp16 or bf16 input"
        if not problem.outputs or problem.outputs[0] != problem.inputs[0]:
            return "output must have the input's shape and dtype"
        return None

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        half = problem.inputs[0].dtype in ("float16", "bfloat16")  # 16 bytes: 8 halves, 4 floats
        return c["VEC"] in ((1, 2, 8) if half else (1, 2, 4))

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        vec = 8 if problem.inputs[0].dtype in ("float16", "bfloat16") else 4
        # First the shape of eager PyTorch's own kernel (128 threads, two vectors each): on an H200 the
        # erf and exp activations lose 2-5% to eager with one vector a thread (measured on an H100).
        return [dict(VEC=vec, BLOCK=128, WAVES=0, UNROLL=2), dict(VEC=vec, BLOCK=256, WAVES=0, UNROLL=4),
                dict(VEC=vec, BLOCK=256, WAVES=0, UNROLL=1)]

    def extra(self, problem: Problem) -> dict[str, Any]:
        dtype = problem.inputs[0].dtype
        return {"OP": problem.ops[0], "DTYPE": dtype,
                "CTYPE": {"float32": "float", "float16": "half", "bfloat16": "__nv_bfloat16"}[dtype]}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        grid = grid_stride_grid(f"cdiv(n, {c['VEC'] * c['UNROLL']})", c["BLOCK"], c["WAVES"])
        return LaunchSpec(entry=self.name, grid=grid, block=f"({c['BLOCK']},)", args=("in0", "out0", "n"),
                          outputs=(("in0.shape", problem.inputs[0].dtype),), bindings=(("n", "in0.numel()"), sm_count("in0")))


class RowFamily(Family):
    """Shared by the one-block-per-row families over the last dim of one fp32 input: the knobs,
    the 32-bit row/column bound of their kernels, and the launch (grid = rows)."""

    ops: dict[tuple[str, ...], str] = {}  # traced ops -> the template's OP
    min_dims = 1

    def __init__(self, name: str) -> None:
        super().__init__(name, {"VEC": (1, 4), "BLOCK": (128, 256, 512, 1024)})

    def supports(self, problem: Problem) -> str | None:
        if problem.ops not in self.ops:
            return f"not a single {' or '.join(sorted(set(self.ops.values())))} over the last dim"
        x = problem.inputs[0] if len(problem.inputs) == 1 else None
        if x is None or x.dtype != "float32" or len(x.shape) < self.min_dims:
            return f"needs one fp32 input of at least {self.min_dims} dim(s)"
        if x.shape[-1] >= 2**31 or x.numel // max(x.shape[-1], 1) >= 2**31:
            return "rows and columns must fit in 32-bit ints"
        return None

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        return True

    def seeds_with_block(self, block: int, second_block: int) -> list[dict[str, Any]]:
        return [dict(VEC=4, BLOCK=block), dict(VEC=4, BLOCK=second_block), dict(VEC=1, BLOCK=block)]

    def output(self, problem: Problem) -> tuple[str, str]:
        raise NotImplementedError

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        return LaunchSpec(entry=self.name, grid="(rows,)", block=f"({c['BLOCK']},)", args=("in0", "out0", "rows", "cols"),
                          outputs=(self.output(problem),),
                          bindings=(("cols", "in0.shape[-1]"), ("rows", "in0.numel() // max(cols, 1)")))


@family(140)
class ReduceRows(RowFamily):
    """Sum, max or argmax over the last dim: one block per row, float4 loads where aligned,
    warp-shuffle reductions (argmax breaks ties towards the first index, as torch does)."""

    ops = {("sum_lastdim",): "sum", ("max_lastdim",): "max", ("argmax_lastdim",): "argmax"}
    min_dims = 2

    def __init__(self) -> None:
        super().__init__("reduce_rows")

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        cols = problem.inputs[0].shape[-1]
        return self.seeds_with_block(1024 if cols >= 16384 else 512 if cols >= 2048 else 128, 256)

    def extra(self, problem: Problem) -> dict[str, Any]:
        op = self.ops[problem.ops]
        return {"OP": op, "OUT_T": "long long" if op == "argmax" else "float"}

    def output(self, problem: Problem) -> tuple[str, str]:
        return ("in0.shape[:-1]", "int64" if self.ops[problem.ops] == "argmax" else "float32")


# Every family, in the order of preference its rank gives (kernels/registry.py: each family's module
# registers it where it is defined).
FAMILIES: list[Family] = registered()
# Last: two kernels where no one family covers the graph (a convolution or GEMM head, any tail).
_HEADS = [f for f in FAMILIES if f.name in ("conv_tf32x3_sm90", "gemm_tf32x3_sm90", "conv_direct")]
# A training-mode dropout is PyTorch's own call (its mask is random): a stage between kernels, never alone.
_SINGLES = list(FAMILIES) + [TorchDropout()]
FAMILIES += staged_families(_HEADS, _SINGLES)
# Three or four kernels, tried only where nothing above covers the graph (its search is the slowest). A
# 1x1 convolution starts one as the GEMM of x as it lies where that leads (one TF32 product allowed).
PIPELINE = Pipeline(_HEADS + [f for f in FAMILIES if f.name == "conv_pointwise_f32"], _SINGLES)


def one_kernel(problem: Problem) -> Family | None:
    """The preferred family whose kernel alone covers the problem (not a module of several): what a
    partition asks of each run of ops."""
    fams, _ = families_for(problem, several=False)
    # A family that matches the run but has no config that fits it (a norm's rows too long for its
    # registers) cannot render it: the next one that has does.
    return next((f for f in fams if not isinstance(f, Staged) and f.seeds(problem)), None)


# Any number of kernels with PyTorch between them: where nothing else covers the graph.
PARTITION = Partition(one_kernel)


def kernel_without_library_ops(problem: Problem) -> Family | None:
    """one_kernel, for a run of ops with no GEMM or convolution in it."""
    return None if any(n.op in LIBRARY_ATEN for n in problem.graph) else one_kernel(problem)


# The GEMMs and convolutions left to the vendor's libraries, the ops after and between them fused into
# kernels of its own: torch.compile's own plan. Once cuDNN may use TF32 (the `pytorch` contract), that
# plan beats the whole-graph template kernels on most of KernelBench level2's convolution files, and
# even eager (cuDNN, then the tail unfused) beats them on a few (docs/benchmarks.md). It comes second, after
# a preferred family that computes the products itself (one kernel, or a pipeline of several, as for
# ResNet's bottleneck and MobileNetV2's block): a search's first seeds are the preferred
# family's three and then the next family's first, and past them a search only mutates what won, so a
# plan offered later is never tried. Where a fused kernel of another kind leads (attention), the
# library's products around it are eager's own plan: not offered.
LIBRARY_AROUND = Partition(kernel_without_library_ops, name="partition:library", bias_apart=True)


def library_around_applies(problem: Problem) -> bool:
    """Whether LIBRARY_AROUND is worth a place among a problem's families: its graph has a library op,
    the library may run it fast (TF32 allowed by the contract, or half-precision tensors), and the
    partition keeps a kernel of its own."""
    if not LIBRARY_ATEN & frozenset(problem.ops):
        return False
    if problem.meta.dtype not in ("float16", "bfloat16") and not tf32_allowed(problem.contract(), problem.ops):
        return False
    return LIBRARY_AROUND.supports(problem) is None


def families_for(problem: Problem, index: bool = True, several: bool = True) -> tuple[list[Family], str]:
    """Every family that covers the problem (first = preferred), or why none does. Families whose
    anchor ops the graph lacks are not asked (their reason would only say so); `index=False` asks
    every family (the tests' check that the index changes nothing but the time). `several=False`
    leaves out the last resorts of several kernels (a pipeline, a partition): a partition asks so of
    each run of ops."""
    if problem.meta.cast and not problem.meta.traced_in_cast:
        # The traced graph is the fp32 one: a family matching it would run fp32 code on the cast
        # tensors, a wrong kernel. Traced in its dtype (loader.load_in_dtype), each family's own dtype
        # checks decide, as for a problem written in that dtype.
        return [], (f"not covered offline (the template library's kernels take the problem as traced, in fp32; "
                    f"{problem.id} runs in {problem.meta.cast} (--dtype)): use an LLM provider")
    odd = unusual_tensors(problem)
    if odd:
        return [], f"not covered offline ({odd}): use an LLM provider"
    found, reasons = [], []
    ops = frozenset(problem.ops)
    asked = [f for f in FAMILIES if not index or could_match(f, ops)]
    asked_ids = {id(f) for f in asked}  # by identity: a family's == compares its fields, thousands of times a partition
    unasked = sorted({op for f in FAMILIES if id(f) not in asked_ids for op in f.anchors or ()})
    if unasked:  # one reason for every family the index skipped
        reasons.append(f"the families built around {', '.join(unasked)}: none of these ops is in the graph")
    for fam in asked:
        why = fam.supports(problem)
        if why is None:
            found.append(fam)
        else:
            reasons.append(f"{fam.name.split(':')[0]}: {why}")  # the two-kernel families say theirs once, as "staged"
    if found:
        # One kernel before two; within each, a family measured faster on the problem first.
        ordered = sorted(found, key=lambda f: (isinstance(f, Staged), not f.leads(problem)))
        if several and ordered[0].name.removeprefix("staged:").startswith(LIBRARY_OPS) and library_around_applies(problem):
            ordered.insert(1, LIBRARY_AROUND)  # where the preferred plan is a product kernel of its own
        return ordered, ""
    if not several:
        return [], "not covered offline (" + "; ".join(dict.fromkeys(reasons)) + ")"
    why = PIPELINE.supports(problem)
    if why is None:  # its kernels compute the products themselves: the library's plan is the other one
        return [PIPELINE, LIBRARY_AROUND] if library_around_applies(problem) else [PIPELINE], ""
    reasons.append(f"{PIPELINE.name}: {why}")
    why = PARTITION.supports(problem)
    if why is None:
        return [PARTITION], ""
    # The last resort's reason leads, with the ops it looked at: what a user reads first; each family's
    # own reason follows for whoever wants to know which came closest.
    ops = list(dict.fromkeys(n.op for n in problem.graph))
    shown = ", ".join(ops[:8]) + (f" and {len(ops) - 8} more" if len(ops) > 8 else "")
    return [], (f"not covered offline: {why} (the graph's ops: {shown or 'none'}); use an LLM provider. Each "
                f"family's reason: " + "; ".join(dict.fromkeys(reasons)))


def family_for(problem: Problem) -> tuple[Family | None, str]:
    fams, why = families_for(problem)
    return (fams[0] if fams else None), why
