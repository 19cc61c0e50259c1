"""fp32 matrix families: a GEMM (3xTF32 tensor cores or plain FFMA) with transposed operands, batches
and a fused elementwise epilogue (bias, activations, scale, residual, a row sum), and a GEMV for
matrix-vector products. Both match the traced graph: mm / bmm / addmm, then the chain."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cuforge.kernels.base import SEED_SMS, SMEM_LIMIT, Family, fills_gpu, tiles
from cuforge.kernels.chains import DTYPE_NAMES, Epilogue, compile_chain
from cuforge.kernels.leaves import leaf_spec
from cuforge.kernels.layouts import VIEW_OPS, apply_view, contiguous, is_dense, layout
from cuforge.op_graph import is_ref
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec
from cuforge.kernels.registry import family


@dataclass(frozen=True)
class GemmMatch:
    """C = epilogue(op(A) @ op(B)) read off the graph: A and B are input/parameter names, ta/tb say
    they are used transposed (stored [K, M] / [N, K])."""

    a: str
    ta: bool
    b: str
    tb: bool
    batched: bool
    m: int
    k: int
    n: int
    epilogue: Epilogue
    out_shape: tuple[int, ...]
    # A is an input of 3+ dims whose leading dims the forward merged into M by a view (x.view(-1, K) @ W,
    # torch.matmul of a 3-D tensor and a matrix); the output is then viewed back to out_shape.
    a_merged: bool = False
    # A batched GEMM over inputs of 4+ dims whose leading dims a view merged into bmm's batch (attention's
    # (batch, heads, rows, cols) operands): those dims, which the output keeps.
    lead: tuple[int, ...] = ()

    def batch(self) -> int:
        """How many products the batch holds."""
        return math.prod(self.lead) if self.lead else self.out_shape[0] if self.batched else 1


_VIEWS = ("view", "reshape", "_unsafe_view")


def _merged_rows(problem: Problem, node: Any) -> str | None:
    """The input a leading view node reads, when it only merges that input's leading dims into one."""
    if node.op not in _VIEWS or not is_ref(node.args[0]) or node.args[0].endswith(".T") or len(node.shape) != 2:
        return None
    spec = leaf_spec(problem, node.args[0])
    if spec is None or len(spec.shape) < 3 or node.shape[-1] != spec.shape[-1]:
        return None
    return node.args[0]


def _operand(problem: Problem, ref: Any, dims: int, dtype: str = "float32") -> tuple[str, bool] | str:
    if not is_ref(ref):
        return f"operand {ref!r} is not a tensor"
    base, transposed = (ref[:-2], True) if ref.endswith(".T") else (ref, False)
    spec = leaf_spec(problem, base)
    if spec is None:
        return f"operand {ref} is not an input or a parameter"
    if spec.dtype != dtype or len(spec.shape) != dims:
        return f"operand {ref} is not a {dims}-D {DTYPE_NAMES.get(dtype, dtype)} tensor"
    return base, transposed


def match_gemm(problem: Problem, dtype: str = "float32") -> GemmMatch | str:
    """The problem as a GEMM with an epilogue, its operands and epilogue tensors of `dtype` (fp32 unless
    a half-precision family asks), or why it is not one."""
    if not problem.graph:
        return "no traced graph"
    found = _match_gemm(problem, dtype)
    if isinstance(found, str) and dtype != "float32":
        return found  # views and batches through views: fp32 families only
    if isinstance(found, str):
        return _viewed_gemm(problem) or _batched_through_views(problem) or found
    return found


def _batched_through_views(problem: Problem) -> GemmMatch | str | None:
    """bmm over N-D inputs (N >= 4) whose leading dims views merged into one batch dim, each operand as
    stored or with its last two dims swapped, the result viewed back to those leading dims and then the
    traced epilogue (attention's q @ k^T over (batch, heads, rows, cols)). None where the graph is not
    that shape; why not, where it is but something else does not fit."""
    graph = problem.graph
    at = next((i for i, n in enumerate(graph) if n.op not in VIEW_OPS), None)
    if not at or graph[at].op != "bmm" or len(graph) < at + 2:
        return None
    mm, back = graph[at], graph[at + 1]
    la, lb = layout(problem, mm.args[0]), layout(problem, mm.args[1])
    if la is None or lb is None:
        return None
    (a, sha, sta), (b, shb, stb) = la, lb
    spec_a, spec_b = leaf_spec(problem, a), leaf_spec(problem, b)
    if spec_a is None or spec_b is None or len(spec_a.shape) < 4 or len(sha) != 3 or len(shb) != 3:
        return None
    lead = tuple(spec_a.shape[:-2])
    batch, m, k = sha
    n = shb[2]
    if tuple(spec_b.shape[:-2]) != lead or math.prod(lead) != batch or shb[0] != batch:
        return "the operands' leading dims differ"
    if spec_a.dtype != "float32" or spec_b.dtype != "float32":
        return "operands are not fp32"
    operands = []
    for spec, shape, strides in ((spec_a, sha, sta), (spec_b, shb, stb)):
        rows, cols = shape[1:]
        if tuple(spec.shape[-2:]) == (rows, cols) and is_dense(shape, strides):
            operands.append(False)
        elif tuple(spec.shape[-2:]) == (cols, rows) and is_dense((batch, cols, rows), (strides[0], strides[2], strides[1])):
            operands.append(True)
        else:
            return "an operand is neither its input as stored nor that with its last two dims swapped"
    ta, tb = operands
    if back.op not in VIEW_OPS or back.args[0] != mm.out or tuple(back.shape) != lead + (m, n):
        return "the batched product is not viewed back to its inputs' leading dims"
    epi = compile_chain(problem, graph[at + 2:], back.out, tuple(back.shape))
    if isinstance(epi, str):
        return epi
    if epi.rowsum:
        return "a row sum of a GEMM batched over several dims"
    return GemmMatch(a, ta, b, tb, True, m, k, n, epi, lead + (m, n), lead=lead)


def _viewed_gemm(problem: Problem) -> GemmMatch | None:
    """A GEMM written through views alone (einsum("bijl,lk->bijk"), a one-batch bmm of reshaped
    operands): views, one mm or one-batch bmm, views; operands that resolve to row-major or transposed
    leaves (A's leading dims may be merged), and a result that is the product's memory as it is."""
    graph = problem.graph
    at = next((i for i, n in enumerate(graph) if n.op not in VIEW_OPS), None)
    if at is None or graph[at].op not in ("mm", "bmm") or len(problem.graph_outputs) != 1:
        return None
    mm, rest = graph[at], graph[at + 1:]
    if (mm.op == "bmm" and mm.shape[0] != 1) or any(n.op not in VIEW_OPS for n in rest):
        return None
    la, lb = layout(problem, mm.args[0]), layout(problem, mm.args[1])
    if la is None or lb is None:
        return None
    (a, sha, sta), (b, shb, stb) = la, lb
    if mm.op == "bmm":
        sha, sta, shb, stb = sha[1:], sta[1:], shb[1:], stb[1:]
    (m, k), n = sha, shb[1]
    spec_a, spec_b = leaf_spec(problem, a), leaf_spec(problem, b)
    if spec_a is None or spec_b is None or spec_a.dtype != "float32" or spec_b.dtype != "float32":
        return None
    rows = tuple(spec_a.shape)
    if is_dense((m, k), sta) and rows[-1] == k and math.prod(rows) == m * k:
        ta, merged = False, len(rows) > 2
    elif is_dense((k, m), sta[::-1]) and rows == (k, m):
        ta, merged = True, False
    else:
        return None
    if is_dense((k, n), stb) and tuple(spec_b.shape) == (k, n):
        tb = False
    elif is_dense((n, k), stb[::-1]) and tuple(spec_b.shape) == (n, k):
        tb = True
    else:
        return None
    name, shape, strides = mm.out, tuple(mm.shape), contiguous(tuple(mm.shape))
    for node in rest:  # the result through the views after the product: still the product's memory
        src = node.args[0] if node.args and is_ref(node.args[0]) else None
        if src not in (name, name + ".T"):
            return None
        after = apply_view(node, shape, strides, src.endswith(".T"))
        if after is None:
            return None
        name, (shape, strides) = node.out, after
    if problem.graph_outputs != (name,) or not is_dense(shape, strides) or (not merged and shape != (m, n)):
        return None
    return GemmMatch(a, ta, b, tb, False, m, k, n, Epilogue(), shape if merged else (m, n), a_merged=merged)


def _match_gemm(problem: Problem, dtype: str = "float32") -> GemmMatch | str:
    graph = problem.graph
    merged = _merged_rows(problem, graph[0]) if len(graph) > 1 else None
    if merged is not None:
        graph = graph[1:]
    first = graph[0]
    if first.op not in ("mm", "bmm", "addmm"):
        return "does not start with mm, bmm or addmm"
    bias = None
    args = first.args
    if first.op == "addmm":
        if first.kwarg("beta", 1) != 1 or first.kwarg("alpha", 1) != 1:
            return "addmm with beta or alpha other than 1"
        bias, args = args[0], args[1:]
    dims = 3 if first.op == "bmm" else 2
    if merged is not None and (first.op == "bmm" or args[0] != problem.graph[0].out):
        return "a view that is not the GEMM's left operand"
    if merged is not None and leaf_spec(problem, merged).dtype != dtype:  # type: ignore[union-attr]
        return f"operand {merged} is not a {DTYPE_NAMES.get(dtype, dtype)} tensor"
    ops = [(merged, False) if merged is not None and i == 0 else _operand(problem, r, dims, dtype) for i, r in enumerate(args[:2])]
    for o in ops:
        if isinstance(o, str):
            return o
    (a, ta), (b, tb) = ops  # type: ignore[misc]
    sa, sb = leaf_spec(problem, a).shape, leaf_spec(problem, b).shape  # type: ignore[union-attr]
    if merged is not None:
        sa = tuple(problem.graph[0].shape)
    m, k = (sa[-1], sa[-2]) if ta else (sa[-2], sa[-1])
    n = sb[-2] if tb else sb[-1]
    if dims == 3 and sa[0] != sb[0]:
        return "batch sizes differ"
    nodes = graph[1:]
    out_view = None
    anchor, full, result = first.out, tuple(first.shape), None
    if merged is not None:  # the result is viewed back to the input's leading dims: the same memory
        lead = tuple(leaf_spec(problem, a).shape[:-1])  # type: ignore[union-attr]

        def view_back(node: Any) -> bool:
            return node.op in _VIEWS and tuple(node.shape) == lead + (n,)

        if nodes and view_back(nodes[0]) and nodes[0].args[0] == first.out:  # view, then the epilogue
            out_view, anchor, full, nodes = tuple(nodes[0].shape), nodes[0].out, tuple(nodes[0].shape), nodes[1:]
        elif nodes and view_back(nodes[-1]) and problem.graph_outputs == (nodes[-1].out,):  # the epilogue, then the view
            out_view, result, nodes = tuple(nodes[-1].shape), nodes[-1].args[0], nodes[:-1]
        else:
            return "a merged-rows GEMM whose result is not viewed back to the input's leading dims"
    if bias is not None:
        spec = leaf_spec(problem, bias) if is_ref(bias) else None
        if spec is None or spec.dtype != dtype or tuple(spec.shape) not in ((n,), (1, n)):
            return f"addmm's bias is not a {DTYPE_NAMES.get(dtype, dtype)} vector over the output columns"
    epi = compile_chain(problem, nodes, anchor, full, dtype=dtype, bias=bias, result=result, casts=dtype != "float32")
    if isinstance(epi, str):
        return epi
    if out_view is not None:
        if epi.rowsum:
            return "a row sum of a merged-rows GEMM"
        return GemmMatch(a, ta, b, tb, False, m, k, n, epi, out_view, a_merged=True)
    out_shape = tuple(first.shape[:-1]) + ((1,) if epi.keepdim else ()) if epi.rowsum else tuple(first.shape)
    return GemmMatch(a, ta, b, tb, dims == 3, m, k, n, epi, out_shape)


def _shape_expr(m: str, n: str, batched: bool, rowsum: bool, keepdim: bool = False) -> str:
    dims = (["BATCH"] if batched else []) + [m] + (["1"] if keepdim else [] if rowsum else [n])
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def gemm_launch_names(f: GemmMatch) -> tuple[list[tuple[str, str]], tuple[str, str]]:
    """What every fp32 GEMM kernel's launch reads off a match: the M, K, N and BATCH bindings, and
    the output's (shape expression, dtype)."""
    bindings = [("M", f"{f.a}.numel() // {f.a}.shape[-1]" if f.a_merged else f"{f.a}.shape[-1]" if f.ta else f"{f.a}.shape[-2]"),
                ("K", f"{f.a}.shape[-2]" if f.ta else f"{f.a}.shape[-1]"),
                ("N", f"{f.b}.shape[-2]" if f.tb else f"{f.b}.shape[-1]"),
                ("BATCH", f"{f.a}.numel() // ({f.a}.shape[-1] * {f.a}.shape[-2])" if f.lead else f"{f.a}.shape[0]" if f.batched else "1")]
    out = (repr(f.out_shape) if f.a_merged else f"(*{f.a}.shape[:-2], M, N)" if f.lead
           else _shape_expr("M", "N", f.batched, f.epilogue.rowsum, f.epilogue.keepdim))
    return bindings, (out, "float32")


@family(60)
class GemmF32(Family):
    """fp32 GEMM on tensor cores or CUDA cores: tf32x3 (mma.sync m16n8k8 on TF32 big/small splits of
    each operand, three products per step: fp32-level accuracy) or ffma; cp.async multistage
    pipeline, grouped rasterization, transposed operands read in place, batches over gridDim.y, and the
    traced epilogue applied in registers (row sums by warp shuffles and one atomic per row and warp)."""

    anchors = frozenset({"mm", "bmm", "addmm"})

    def __init__(self) -> None:
        super().__init__("gemm_f32", {
            "BM": (32, 64, 128, 256), "BN": (32, 64, 128, 256), "BK": (16, 32), "WM": (1, 2, 4), "WN": (1, 2, 4),
            "STAGES": (2, 3, 4, 5), "GROUP_M": (1, 8), "MATH": ("tf32x3", "ffma"), "PROMOTE": (1, 2)})

    def supports(self, problem: Problem) -> str | None:
        found = match_gemm(problem)
        return found if isinstance(found, str) else None

    @staticmethod
    def smem_bytes(c: dict[str, Any]) -> int:
        # The larger of the two paddings, so one size serves every operand layout.
        return c["STAGES"] * (c["BM"] * (c["BK"] + 8) + c["BN"] * (c["BK"] + 8) + 8 * (c["BM"] + c["BN"])) * 4

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        warps = c["WM"] * c["WN"]
        if warps not in (2, 4, 8) or c["BM"] % c["WM"] or c["BN"] % c["WN"]:
            return False
        if c["PROMOTE"] != 1 and (c["MATH"] != "tf32x3" or c["BK"] % (8 * c["PROMOTE"])):
            return False  # k-steps per fresh tensor-core sum: a tf32x3 knob
        wtm, wtn = c["BM"] // c["WM"], c["BN"] // c["WN"]
        if c["MATH"] == "tf32x3":
            if wtm % 16 or wtn % 8:
                return False
            accumulators = (wtm // 16) * (wtn // 8) * 4
        else:
            if wtm % 4 or wtn % 8:
                return False
            accumulators = (wtm // 4) * (wtn // 8)
        return 16 <= accumulators <= 128 and self.smem_bytes(c) <= SMEM_LIMIT

    PRESETS: tuple[dict[str, Any], ...] = (
        dict(BM=128, BN=128, BK=32, WM=2, WN=4, STAGES=3, GROUP_M=8, MATH="tf32x3", PROMOTE=1),
        dict(BM=128, BN=64, BK=32, WM=2, WN=2, STAGES=4, GROUP_M=8, MATH="tf32x3", PROMOTE=1),
        dict(BM=64, BN=64, BK=32, WM=2, WN=2, STAGES=4, GROUP_M=8, MATH="tf32x3", PROMOTE=1),
        dict(BM=64, BN=32, BK=32, WM=2, WN=1, STAGES=4, GROUP_M=1, MATH="tf32x3", PROMOTE=1),
        dict(BM=32, BN=32, BK=32, WM=1, WN=2, STAGES=4, GROUP_M=1, MATH="tf32x3", PROMOTE=1),
    )
    FFMA = dict(BM=128, BN=128, BK=16, WM=2, WN=4, STAGES=3, GROUP_M=8, MATH="ffma", PROMOTE=1)

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        found = match_gemm(problem)
        assert not isinstance(found, str)
        batch = found.batch()
        valid = [c for c in self.PRESETS if self.valid(c, problem)]

        def blocks(c: dict[str, Any]) -> int:
            return tiles(found.m, found.n, c["BM"], c["BN"]) * batch

        filling = [c for c in valid if fills_gpu(blocks(c))]
        first = filling[0] if filling else valid[-1]
        rest = sorted((c for c in valid if c is not first), key=lambda c: abs(blocks(c) - SEED_SMS))
        ffma = {**self.FFMA, "BM": first["BM"], "BN": first["BN"], "WM": first["WM"], "WN": first["WN"]}
        ffma = ffma if self.valid(ffma, problem) else self.FFMA
        paired = {**first, "PROMOTE": 2}  # half the fp32 adds, if its accuracy holds on this K
        return [first, *rest[:1], *([paired] if self.valid(paired, problem) else []), ffma, *rest[1:]]

    def extra(self, problem: Problem) -> dict[str, Any]:
        found = match_gemm(problem)
        assert not isinstance(found, str)
        # 16-byte copies need the contiguous dim of each stored operand to be a multiple of 4.
        va = 4 if (found.m if found.ta else found.k) % 4 == 0 else 1
        vb = 4 if (found.k if found.tb else found.n) % 4 == 0 else 1
        return {"TA": found.ta, "TB": found.tb, "VA": va, "VB": vb, "BATCHED": found.batched, "A_SHARED": False,
                "EPI": found.epilogue}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        f = match_gemm(problem)
        assert not isinstance(f, str)
        bindings, out = gemm_launch_names(f)
        return LaunchSpec(entry=self.name, grid=f"(cdiv(M, {c['BM']}) * cdiv(N, {c['BN']}), BATCH)",
                          block=f"({c['WM'] * c['WN'] * 32},)", shared_mem=str(self.smem_bytes(c)),
                          args=(f.a, f.b, "out0", "M", "N", "K", *f.epilogue.launch_args()),
                          outputs=((*out, "zeros"),) if f.epilogue.rowsum else (out,), bindings=tuple(bindings))


@family(40)
class Gemv(Family):
    """fp32 matrix-vector product y = epilogue(A @ x) with x a [K] or [K, 1] vector: one warp per row,
    streaming 16-byte loads of A (evict-first, several in flight) and x from cache."""

    anchors = frozenset({"mm", "bmm", "addmm", "mv"})

    def __init__(self) -> None:
        super().__init__("gemv_f32", {"BLOCK": (128, 256, 512), "VEC": (1, 4), "UNROLL": (1, 2, 4, 8), "ROWS": (1, 2, 4)})

    DEFAULTS = {"ROWS": 1}

    @staticmethod
    def match(problem: Problem) -> GemmMatch | str:
        if problem.graph and problem.graph[0].op == "mv":  # torch.mv / matmul of a matrix and a 1-D vector
            node = problem.graph[0]
            ops = [_operand(problem, node.args[0], 2), _operand(problem, node.args[1], 1)]
            for o in ops:
                if isinstance(o, str):
                    return o
            (a, ta), (x, _) = ops  # type: ignore[misc]
            if ta:
                return "the matrix is used transposed"
            epi = compile_chain(problem, problem.graph[1:], node.out, tuple(node.shape), allow_rowsum=False)
            if isinstance(epi, str):
                return epi
            m, k = leaf_spec(problem, a).shape  # type: ignore[union-attr]
            return GemmMatch(a, False, x, False, False, m, k, 1, epi, tuple(node.shape))
        found = match_gemm(problem)
        if isinstance(found, str):
            return found
        if found.n != 1 or found.ta or found.batched or found.epilogue.rowsum or found.a_merged:
            return "not a matrix times one column vector"
        return found

    def supports(self, problem: Problem) -> str | None:
        found = self.match(problem)
        return found if isinstance(found, str) else None

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        c = self.complete(c)
        return (c["UNROLL"] == 1 or c["VEC"] == 4) and c["ROWS"] * c["UNROLL"] <= 16  # float4s in flight a lane

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        # Two rows a warp, each load of x serving both: KernelBench's 2048 x 1048576 product 2.84-2.87 ms
        # against 2.91 at best for one row a warp, whose loads of x from L2 match A's from DRAM byte for byte
        # (kb_s23_gemv_probe, kb_s23_gemv_probe2; eager's cuBLAS 2.88).
        return [dict(BLOCK=256, VEC=4, UNROLL=8, ROWS=2), dict(BLOCK=256, VEC=4, UNROLL=4, ROWS=2),
                dict(BLOCK=256, VEC=4, UNROLL=4), dict(BLOCK=128, VEC=4, UNROLL=2), dict(BLOCK=512, VEC=4, UNROLL=1)]

    def extra(self, problem: Problem) -> dict[str, Any]:
        found = self.match(problem)
        assert not isinstance(found, str)
        return {"EPI": found.epilogue}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        f = self.match(problem)
        assert not isinstance(f, str)
        shape = "(M, 1)" if len(f.out_shape) == 2 else "(M,)"
        warps = "M" if c["ROWS"] == 1 else f"cdiv(M, {c['ROWS']})"  # one row a warp: the spec it always had
        grid = f"(cdiv({warps} * 32, {c['BLOCK']}),)"
        return LaunchSpec(entry=self.name, grid=grid, block=f"({c['BLOCK']},)",
                          args=(f.a, f.b, "out0", "M", "K", *f.epilogue.launch_args()), outputs=((shape, "float32"),),
                          bindings=(("M", f"{f.a}.shape[0]"), ("K", f"{f.a}.shape[1]")))
