"""Attention in one kernel (flash attention): softmax(chain(Q @ K^T)) @ V, where the chain is what the
traced graph does to the scores (the scale, a causal or boolean mask, a bias, GPT-2's masked_fill).
Covers scaled_dot_product_attention as PyTorch decomposes it (fp16/bf16 inputs cast to fp32, grouped
key/value heads expanded, the causal mask built from tril of ones) and the same written out. The scores
never reach memory: a block keeps its query rows' running (max, sum) and output in registers while it
streams key/value tiles, and skips the tiles a causal mask hides. fp16/bf16 on mma.sync with fp32
accumulation; the probabilities are rounded to the input's type for the second product, as PyTorch's
flash and cuDNN kernels round them."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from cuforge.kernels.base import SMEM_LIMIT, GraphFamily
from cuforge.kernels.chains import Epilogue, compile_chain
from cuforge.kernels.gemm import HALF_ELEMENTS
from cuforge.kernels.leaves import leaf_spec, producer, refs_in
from cuforge.kernels.registry import family
from cuforge.kernels.softmax import SAFE_OPS, SOFTMAX_OPS, depends_on_inputs
from cuforge.op_graph import OpNode, is_ref, scalar_factor
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec

VIEWS = ("view", "_unsafe_view", "reshape")
PRODUCTS = ("bmm", "mm")
MAX_HEAD_DIM = 128  # the output rows of a warp stay in registers


@dataclass(frozen=True)
class Operand:
    leaf: str  # the input or parameter read
    transposed: bool  # the product reads it with its last two dims swapped (K in Q @ K^T)
    group: int  # heads sharing it: a key/value head repeated for `group` query heads


@dataclass(frozen=True)
class AttentionMatch:
    q: str
    k: str
    v: str
    dtype: str
    heads: int  # batch x query heads: the grid's y
    sq: int
    sk: int
    d: int
    group: int
    scores: Epilogue  # the chain from the raw scores to the softmax's input
    mask: str  # "none", "causal" (column <= row + diag), "keep" (a (sq, sk) bool tensor: True takes part)
    diag: int
    keep: str | None
    safe: bool  # a row masked throughout comes out 0 (scaled_dot_product_attention), not NaN
    out_shape: tuple[int, ...]
    scale: float = 1.0  # a positive factor of the scores taken out of the chain into the exponent


def _shape(problem: Problem, ref: str) -> tuple[int, ...] | None:
    """The shape of a ref, a transposed one ("x.T") with its last two dims swapped."""
    base, t = (ref[:-2], True) if ref.endswith(".T") else (ref, False)
    spec = leaf_spec(problem, base)
    node = producer(problem, base) if spec is None else None
    shape = tuple(spec.shape) if spec is not None else (tuple(node.shape) if node is not None else None)
    if shape is None or (t and len(shape) < 2):
        return None
    return shape[:-2] + (shape[-1], shape[-2]) if t else shape


def resolve(problem: Problem, ref: str, dtype: str | None = None) -> Operand | str:
    """The input a product's operand reads and how: through views that only merge or split leading
    dims, casts of a fp16/bf16 leaf to fp32, transposes of the last two dims, and the repeat of grouped
    key/value heads (unsqueeze, expand, view: repeat_interleave as traced)."""
    transposed, group = False, 1
    while True:
        if ref.endswith(".T"):
            transposed, ref = not transposed, ref[:-2]
        spec = leaf_spec(problem, ref)
        if spec is not None:
            if spec.dtype not in HALF_ELEMENTS or (dtype is not None and spec.dtype != dtype):
                return f"{ref} is {spec.dtype}, not fp16 or bf16 like the other operands"
            if not spec.contiguous or len(spec.shape) < 2:
                return f"{ref} is not a contiguous tensor of two or more dims"
            return Operand(ref, transposed, group)
        node = producer(problem, ref)
        if node is None or not node.args or not is_ref(node.args[0]):
            return f"{ref} is not made from an input by views, casts and head repeats"
        src = node.args[0]
        src_shape = _shape(problem, src)
        if node.op == "_to_copy" and dict(node.kwargs).get("dtype") == "torch.float32" and len(node.args) == 1:
            ref = src
            continue
        if node.op in VIEWS and src_shape is not None:
            rep = _repeat_of(problem, src, tuple(node.shape))
            if rep is not None:
                ref, group = rep[0], group * rep[1]
                continue
            if tuple(node.shape[-2:]) != tuple(src_shape[-2:]) or len(node.shape) < 2:
                return f"a view of {src} that changes its last two dims"
            ref = src
            continue
        return f"{ref} comes from {node.op}, not a view, a cast or a head repeat of an input"


def _repeat_of(problem: Problem, src: str, shape: tuple[int, ...]) -> tuple[str, int] | None:
    """(x, g) when `src` viewed as `shape` is x with each head repeated g times in place
    (x.unsqueeze(h + 1).expand(..., g, ...).view(...), which repeat_interleave(g, dim=h) traces to)."""
    expand = producer(problem, src)
    if expand is None or expand.op != "expand" or not is_ref(expand.args[0]):
        return None
    unsq = producer(problem, expand.args[0])
    if unsq is None or unsq.op != "unsqueeze" or len(unsq.args) < 2 or not is_ref(unsq.args[0]):
        return None
    dim, before, after = unsq.args[1], tuple(unsq.shape), tuple(expand.shape)
    # The repeated dim must be the last before (rows, d): then query head h reads key/value head h // g
    # of the flattened leading dims. A repeat of an outer dim (a batch tiled) maps heads otherwise.
    if not isinstance(dim, int) or dim != len(before) - 3 or dim < 1 or len(after) != len(before):
        return None
    g = after[dim]
    merged = before[:dim - 1] + (before[dim - 1] * g,) + before[dim + 1:]
    if after[:dim] + after[dim + 1:] != before[:dim] + before[dim + 1:] or tuple(shape) != merged:
        return None
    return unsq.args[0], g


def _mask_of(problem: Problem, node: OpNode, x: str) -> tuple[str, int, str | None] | str:
    """An additive mask as the kernel applies it: add(x, where(m, 0, -inf)) with m the causal tril of
    ones ("causal", its diagonal) or a (sq, sk) bool tensor ("keep", the tensor)."""
    w = next((a for a in node.args if is_ref(a) and a != x), None) if not node.kwargs else None
    where = producer(problem, w) if w is not None else None
    if where is None or where.op != "where" or len(where.args) != 3:
        return "the scores' last addend is not a mask"
    m, zero, neg = where.args
    vals = [producer(problem, a) if is_ref(a) else None for a in (zero, neg)]
    consts = [v.args[0] if v is not None and v.op == "scalar_tensor" and v.args else a for v, a in zip(vals, (zero, neg))]
    if consts[0] != 0 or consts[1] != -math.inf or not is_ref(m):
        return "an additive mask other than where(mask, 0, -inf)"
    spec = leaf_spec(problem, m)
    if spec is not None:
        return ("keep", 0, m) if spec.dtype == "bool" and spec.contiguous else "a mask tensor that is not bool"
    tril = producer(problem, m)
    ones = producer(problem, tril.args[0]) if tril is not None and tril.args and is_ref(tril.args[0]) else None
    if tril is None or tril.op != "tril" or ones is None or ones.op != "ones":
        return "an additive mask that is neither a bool tensor nor tril of ones"
    if len(tril.shape) != 2 or tuple(tril.shape) != tuple(node.shape[-2:]):
        return "a causal mask that does not span the scores' last two dims"
    diag = tril.args[1] if len(tril.args) > 1 else tril.kwarg("diagonal", 0)
    if not isinstance(diag, int) or isinstance(diag, bool) or diag < 0:
        return "a causal mask with a diagonal below the main one"
    return "causal", diag, None


def match_attention(problem: Problem) -> AttentionMatch | str:
    # What the outputs depend on (a cast PyTorch makes and drops is not among it).
    live, need = depends_on_inputs(problem.graph), _ancestors(problem.graph_outputs, problem.graph)
    nodes = tuple(n for n in problem.graph if n.out in live and n.out in need)
    prods = [i for i, n in enumerate(nodes) if n.op in PRODUCTS]
    soft = [i for i, n in enumerate(nodes) if n.op in SOFTMAX_OPS]
    if len(prods) != 2 or len(soft) != 1 or not prods[0] < soft[0] < prods[1]:
        return "not softmax(Q @ K^T) @ V: two products with one softmax between them"
    first, sm, second = nodes[prods[0]], nodes[soft[0]], nodes[prods[1]]
    if SOFTMAX_OPS[sm.op] or (len(sm.args) > 2 and sm.args[2] is True):
        return "a log-softmax, or a softmax that changes dtype"
    q = resolve(problem, first.args[0])
    if isinstance(q, str):
        return f"Q: {q}"
    dtype = leaf_spec(problem, q.leaf).dtype
    k, v = resolve(problem, first.args[1], dtype), resolve(problem, second.args[1], dtype)
    if isinstance(k, str) or isinstance(v, str):
        return f"K: {k}" if isinstance(k, str) else f"V: {v}"
    if q.transposed or q.group != 1 or not k.transposed or v.transposed or k.group != v.group:
        return "operands not laid out as Q (rows, d), K and V (keys, d) with one head grouping"
    qs, ks, vs = (tuple(leaf_spec(problem, o.leaf).shape) for o in (q, k, v))
    sq, d, sk = qs[-2], qs[-1], ks[-2]
    heads, kv_heads = math.prod(qs[:-2]), math.prod(ks[:-2])
    if ks[-1] != d or vs != ks or kv_heads * k.group != heads:
        return "Q, K and V shapes do not chain into one attention (V's head dim must equal Q's)"
    if d % 16 or not 16 <= d <= MAX_HEAD_DIM:
        return f"head dim {d}: needs a multiple of 16 up to {MAX_HEAD_DIM}"
    if heads > 65535:
        return "more than 65535 batch x heads (the grid's y limit)"
    anc = _ancestors((sm.args[0],), nodes[prods[0] + 1:soft[0]])
    between = tuple(n for n in nodes[prods[0] + 1:soft[0]] if n.out in anc)
    mask, diag, keep, score_end = "none", 0, None, sm.args[0]
    if between and between[-1].op == "add" and between[-1].out == sm.args[0]:
        x = next((a for a in between[-1].args if is_ref(a) and a in {n.out for n in between[:-1]} | {first.out}), None)
        found = _mask_of(problem, between[-1], x) if x is not None else "no chain value"
        if not isinstance(found, str):
            (mask, diag, keep), score_end = found, x
            anc = _ancestors((x,), between[:-1])
            between = tuple(n for n in between[:-1] if n.out in anc)
    scale, between, score_end = _fold_scale(between, first.out, score_end)
    scores = compile_chain(problem, between, first.out, tuple(first.shape), dtype, allow_rowsum=False, prefix="p",
                           result=score_end, ends_inside=True, casts=True)
    if isinstance(scores, str):
        return f"between Q @ K^T and the softmax: {scores}"
    if keep is not None and tuple(leaf_spec(problem, keep).shape) != (sq, sk):
        return f"a bool mask of shape {list(leaf_spec(problem, keep).shape)}, not ({sq}, {sk})"
    if not _passes(problem, sm.out, second.args[0], dtype):
        return "between the softmax and the product with V: more than views and a cast"
    out = problem.graph_outputs[0] if len(problem.graph_outputs) == 1 else None
    spec = problem.outputs[0] if problem.outputs else None
    if out is None or spec is None or spec.dtype != dtype or not _passes(problem, second.out, out, dtype):
        return "the output is not the product with V as it lies, in the inputs' dtype"
    if tuple(spec.shape[-2:]) != (sq, d) or math.prod(spec.shape) != heads * sq * d:
        return "the output's shape is not Q's"
    return AttentionMatch(q.leaf, k.leaf, v.leaf, dtype, heads, sq, sk, d, k.group, scores, mask, diag, keep,
                          sm.op in SAFE_OPS, tuple(spec.shape), scale)


def _fold_scale(nodes: tuple[OpNode, ...], start: str, end: str) -> tuple[float, tuple[OpNode, ...], str]:
    """(s, the chain without it, its end) where the chain is views, one multiply or divide by a constant
    s > 0 of the raw scores, and masked_fills with -inf: the kernel then scales inside the exponent, as
    exp2((x - max) * s * log2(e)), and takes the max of the unscaled scores (a positive factor keeps the
    order, and -inf stays -inf). Otherwise (1, the chain, its end) unchanged."""
    scaled = [n for n in nodes if n.op in ("mul", "div")]
    if len(scaled) != 1 or any(n.op not in (*VIEWS, "mul", "div", "masked_fill", "bitwise_not", "logical_not")
                               for n in nodes):
        return 1.0, nodes, end
    node = scaled[0]
    found = scalar_factor(node, division=True)
    if found is None or not found[1] > 0:
        return 1.0, nodes, end
    x, factor = found
    if x != start and x not in {n.out for n in nodes if n.op in VIEWS}:
        return 1.0, nodes, end
    reads = {r for n in nodes for r in refs_in(n)}
    for n in nodes:
        if n.op == "masked_fill" and (len(n.args) < 3 or n.args[2] != -math.inf):
            return 1.0, nodes, end
    if node.out not in reads and node.out != end:
        return 1.0, nodes, end
    rest = tuple(replace(n, args=tuple(x if a == node.out else a for a in n.args)) for n in nodes if n is not node)
    return factor, rest, (x if end == node.out else end)


def _passes(problem: Problem, start: str, end: str, dtype: str) -> bool:
    """Whether `end` is `start` through views that keep the last two dims and casts to fp32 or to
    `dtype` alone."""
    cur = end
    while cur != start:
        n = producer(problem, cur)
        if n is None or not n.args or not is_ref(n.args[0]):
            return False
        cast = n.op == "_to_copy" and dict(n.kwargs).get("dtype") in ("torch.float32", f"torch.{dtype}")
        src = _shape(problem, n.args[0])
        if not cast and not (n.op in VIEWS and src is not None and tuple(n.shape[-2:]) == tuple(src[-2:])):
            return False
        cur = n.args[0]
    return True


def _ancestors(refs: tuple[str | None, ...], nodes: tuple[OpNode, ...]) -> set[str]:
    """The outs among `nodes` that `refs` are or depend on."""
    outs, found = {n.out: n for n in nodes}, set()
    todo = [r for r in refs if r]
    while todo:
        r = todo.pop()
        r = r[:-2] if r.endswith(".T") else r
        if r in outs and r not in found:
            found.add(r)
            todo.extend(refs_in(outs[r]))
    return found


@family(125)
class FlashAttention(GraphFamily):
    """A block: WARPS warps of 16 * MW query rows each; BN-key tiles of K and V through a STAGES-deep
    cp.async pipeline; QREG keeps the warp's query fragments in registers instead of re-reading them
    from shared memory for every tile."""

    anchors = frozenset(SOFTMAX_OPS)

    def __init__(self) -> None:
        super().__init__("flash_attention", {"WARPS": (4, 8), "MW": (1, 2), "BN": (32, 64, 128), "STAGES": (2, 3),
                                             "QREG": (0, 1)})

    def match(self, problem: Problem) -> AttentionMatch | str:
        return self.memo_match(problem)

    def _match(self, problem: Problem) -> AttentionMatch | str:
        return match_attention(problem)

    @staticmethod
    def smem_bytes(c: dict[str, Any], d: int) -> int:
        """The block's query rows and the stages of key and value tiles, rows padded by 16 bytes."""
        return (16 * c["MW"] * c["WARPS"] + 2 * c["STAGES"] * c["BN"]) * (d + 8) * 2

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        m = self.match(problem)
        if isinstance(m, str):
            return False
        # Per thread: the output rows, one tile's scores and (QREG) the query fragments.
        registers = c["MW"] * (m.d + c["BN"]) // 2 + c["QREG"] * c["MW"] * m.d // 4
        return registers <= 192 and self.smem_bytes(c, m.d) <= SMEM_LIMIT

    PRESETS: tuple[dict[str, Any], ...] = (
        dict(WARPS=4, MW=2, BN=64, STAGES=2, QREG=0), dict(WARPS=4, MW=1, BN=64, STAGES=2, QREG=1),
        dict(WARPS=4, MW=1, BN=64, STAGES=2, QREG=0), dict(WARPS=8, MW=1, BN=64, STAGES=2, QREG=1),
        dict(WARPS=4, MW=1, BN=128, STAGES=2, QREG=1), dict(WARPS=4, MW=2, BN=32, STAGES=3, QREG=0),
        dict(WARPS=8, MW=1, BN=32, STAGES=3, QREG=0),
    )

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        return [c for c in self.PRESETS if self.valid(c, problem)]

    def extra(self, problem: Problem) -> dict[str, Any]:
        m = self.matched(problem)
        return {"HALF": True, "ELEM": HALF_ELEMENTS[m.dtype], "D": m.d, "GROUP": m.group, "MASK": m.mask, "DIAG": m.diag,
                "SAFE": m.safe, "PRO": m.scores, "SCALE": repr(m.scale)}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        m = self.matched(problem)
        bm = 16 * c["MW"] * c["WARPS"]
        keep = (m.keep,) if m.keep else ()
        return LaunchSpec(entry=self.name, grid=f"(cdiv(SQ, {bm}), {m.heads})", block=f"({32 * c['WARPS']},)",
                          shared_mem=str(self.smem_bytes(c, m.d)),
                          args=(m.q, m.k, m.v, "out0", "SQ", "SK", *keep, *m.scores.launch_args()),
                          outputs=((str(m.out_shape), m.dtype),),
                          bindings=(("SQ", f"{m.q}.shape[-2]"), ("SK", f"{m.k}.shape[-2]")))
