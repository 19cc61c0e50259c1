"""Softmax (or log-softmax) over the rows of an fp16 GEMM, as attention scores are: softmax(Q @ K^T *
scale [masked]) in one kernel that never writes the scores. The ops between the GEMM and the softmax
(scale, causal mask, bias) and after it are the traced chains, fused."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cuforge.kernels.base import SMEM_LIMIT, Family
from cuforge.kernels.chains import Epilogue, compile_chain
from cuforge.kernels.gemm import HALF_ELEMENTS
from cuforge.kernels.leaves import leaf_spec
from cuforge.kernels.softmax import SAFE_OPS, SOFTMAX_OPS, depends_on_inputs
from cuforge.op_graph import is_ref
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec
from cuforge.kernels.registry import family

MAX_K = 256  # the block's A rows stay in shared memory


@dataclass(frozen=True)
class GemmSoftmaxMatch:
    a: str
    b: str  # a leaf ref (the kernel reads it as stored)
    b_transposed: bool  # B is the transpose of a stored N x K tensor (Q @ K^T)
    batched: bool  # bmm on 3-D operands (the batch is the grid's y)
    batch: int
    m: int
    n: int
    k: int
    log: bool
    prologue: Epilogue
    epilogue: Epilogue


def match_gemm_softmax(problem: Problem) -> GemmSoftmaxMatch | str:
    live = depends_on_inputs(problem.graph)
    nodes = tuple(n for n in problem.graph if n.out in live)
    if not nodes or nodes[0].op not in ("bmm", "mm"):
        return "does not start with an mm or bmm"
    gemm = nodes[0]
    soft = [i for i, n in enumerate(nodes) if n.op in SOFTMAX_OPS and n.op not in SAFE_OPS]
    if len(soft) != 1:
        return "not one softmax over the last dim after the GEMM"
    a, b = gemm.args[:2]
    b_leaf = b[:-2] if is_ref(b) and b.endswith(".T") else b
    sa = leaf_spec(problem, a) if is_ref(a) else None
    sb = leaf_spec(problem, b_leaf) if is_ref(b_leaf) else None
    ndim = 3 if gemm.op == "bmm" else 2
    if sa is None or sb is None or sa.dtype != "float16" or sb.dtype != "float16" or len(sa.shape) != ndim \
            or len(sb.shape) != ndim:
        return f"{gemm.op}'s operands are not fp16 inputs or parameters as stored (A must not be transposed)"
    bt = b_leaf != b
    batch = sa.shape[0] if ndim == 3 else 1
    m, k = sa.shape[-2:]
    n = sb.shape[-2] if bt else sb.shape[-1]
    if (sb.shape[-1] if bt else sb.shape[-2]) != k or (ndim == 3 and sb.shape[0] != batch):
        return "operand shapes do not chain"
    if k % 8 or n % 8 or k > MAX_K or k == 0:
        return f"needs K and N multiples of 8 and K <= {MAX_K} (K={k}, N={n})"
    if batch * m * n >= 2**40 or m >= 2**31 or batch > 65535:
        return "too large for the kernel's indexing (or more than 65535 batches, the grid's y limit)"
    full = tuple(gemm.shape)
    si = soft[0]
    pro = compile_chain(problem, nodes[1:si], gemm.out, full, "float16", allow_rowsum=False, prefix="p",
                        result=nodes[si].args[0], ends_inside=True)
    if isinstance(pro, str):
        return f"between the GEMM and the softmax: {pro}"
    if len(nodes[si].args) > 2 and nodes[si].args[2] is True:
        return "softmax with an output dtype change (half_to_float)"
    epi = compile_chain(problem, nodes[si + 1:], nodes[si].out, full, "float16", allow_rowsum=False)
    if isinstance(epi, str):
        return f"after the softmax: {epi}"
    if not problem.outputs or problem.outputs[0].dtype != "float16":
        return "the output is not fp16"
    return GemmSoftmaxMatch(a, b_leaf, bt, ndim == 3, batch, m, n, k, SOFTMAX_OPS[nodes[si].op], pro, epi)


@family(130)
class GemmSoftmax(Family):
    """mma.sync m16n8k16 GEMM whose block owns 16 rows per warp across all N: B streamed twice
    (statistics, then output) through a cp.async pipeline, scores never leave registers."""

    template = "gemm_softmax"
    anchors = frozenset(SOFTMAX_OPS) - SAFE_OPS  # its match needs one such softmax after the GEMM

    def __init__(self) -> None:
        super().__init__("gemm_softmax", {"WARPS": (2, 4, 8), "MW": (1, 2), "BN": (32, 64, 128),
                                          "STAGES": (2, 3, 4)})

    def supports(self, problem: Problem) -> str | None:
        found = match_gemm_softmax(problem)
        return found if isinstance(found, str) else None

    @staticmethod
    def smem_expr(c: dict[str, Any], bt: bool) -> str:
        """Dynamic shared memory in bytes, as an expression in K: the block's A rows plus the B stages."""
        k16 = "(cdiv(K, 16) * 16)"
        b_tile = f"{c['BN']} * ({k16} + 8)" if bt else f"{k16} * {c['BN'] + 8}"
        return f"2 * ({16 * c['MW'] * c['WARPS']} * ({k16} + 8) + {c['STAGES']} * {b_tile})"

    @classmethod
    def smem_bytes(cls, c: dict[str, Any], k: int, bt: bool) -> int:
        """The same expression at a given K (what valid() checks against the shared-memory limit)."""
        return int(eval(cls.smem_expr(c, bt), {"__builtins__": {}}, {"K": k, "cdiv": lambda a, b: -(-a // b)}))  # noqa: S307

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        f = match_gemm_softmax(problem)
        accumulators = c["MW"] * c["BN"] // 2  # per thread: MW x BN/8 tiles x 4
        return not isinstance(f, str) and accumulators <= 64 and self.smem_bytes(c, f.k, f.b_transposed) <= SMEM_LIMIT

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        out = [dict(WARPS=4, MW=2, BN=64, STAGES=3), dict(WARPS=8, MW=1, BN=64, STAGES=3),
               dict(WARPS=4, MW=1, BN=128, STAGES=2), dict(WARPS=8, MW=2, BN=32, STAGES=4), dict(WARPS=4, MW=1, BN=64, STAGES=3)]
        return [c for c in out if self.valid(c, problem)]

    def extra(self, problem: Problem) -> dict[str, Any]:
        f = match_gemm_softmax(problem)
        assert not isinstance(f, str)
        return {"BT": f.b_transposed, "LOG": f.log, "PRO": f.prologue, "EPI": f.epilogue, "HALF": True,
                "ELEM": HALF_ELEMENTS["float16"]}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        f = match_gemm_softmax(problem)
        assert not isinstance(f, str)
        dims = (("M", f"{f.a}.shape[-2]"), ("K", f"{f.a}.shape[-1]"),
                ("N", f"{f.b}.shape[-2]" if f.b_transposed else f"{f.b}.shape[-1]"),
                ("BATCH", f"{f.a}.shape[0]" if f.batched else "1"))
        out_shape = "(BATCH, M, N)" if f.batched else "(M, N)"
        bm = 16 * c["MW"] * c["WARPS"]
        return LaunchSpec(entry=self.name, grid=f"(cdiv(M, {bm}), BATCH)", block=f"({32 * c['WARPS']},)",
                          shared_mem=self.smem_expr(c, f.b_transposed),
                          args=(f.a, f.b, "out0", "M", "N", "K", *f.prologue.launch_args(), *f.epilogue.launch_args()),
                          outputs=((out_shape, "float16"),), bindings=dims)

