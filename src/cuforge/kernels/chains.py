"""Matching a traced forward (Problem.graph) into what the kernel families fuse: an anchor op (a GEMM,
a norm) followed by a chain of elementwise ops, compiled into C statements that run on each output
value in registers before the one store (and optionally summed over the last dim)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cuforge.op_graph import OpNode, is_last_dim, is_ref
from cuforge.kernels.leaves import (LEAF_VIEWS, broadcast_index, broadcast_kind, channel_kind, leaf_spec, leaf_views,
                                    producer, refs_in)
from cuforge.kernels.pieces import Interleave, interleavings, last_dim_slice, rotations, strided_slice
from cuforge.problems.problem import Problem


@dataclass(frozen=True)
class Epilogue:
    """C statements that turn `v` (the anchor's fp32 value at flat row r, column c) into the output
    value, reading `tensors` (kernel arguments e0, e1, ... indexed per element, per column or per row)."""

    body: str = ""
    tensors: tuple[tuple[str, str], ...] = ()  # (ref, "rc" | "c" | "r" | "s" | "ch")
    rowsum: bool = False  # the output is the epilogue value summed over the last dim
    keepdim: bool = False  # ... kept as a dim of size 1
    prefix: str = "e"  # the tensors' parameter names: e0, e1, ... (a prologue uses p0, ...)
    ctype: str = "float"  # their element type (__half for fp16 chains, read through __half2float)
    # The body needs the real row and column (per-row/column operands, masks); else it reads r and c
    # only as r * cols + c, and an elementwise kernel may pass r = 0, c = the flat index.
    indexed: bool = False
    masks: frozenset[int] = frozenset()  # indices of the tensors that are bool masks (read as bool)

    def params(self) -> str:
        """The extra parameters of a kernel (and of its epilogue function)."""
        return "".join(f", const {'bool' if i in self.masks else self.ctype}* __restrict__ {self.prefix}{i}"
                       for i in range(len(self.tensors)))

    def args(self) -> str:
        return "".join(f", {self.prefix}{i}" for i in range(len(self.tensors)))

    def launch_args(self) -> tuple[str, ...]:
        return tuple(ref for ref, _ in self.tensors)


def literal(x: float | int | bool) -> str:
    """A C float literal for a traced constant."""
    x = float(x)
    if math.isnan(x):
        return "__int_as_float(0x7fffffff)"
    if math.isinf(x):
        return "__int_as_float(0x7f800000)" if x > 0 else "__int_as_float(0xff800000)"
    return f"{x!r}f"


def _unary(op: str, node: OpNode, x: str) -> str | None:
    table = {
        "relu": f"fmaxf({x}, 0.f)",
        "gelu": f"0.5f * {x} * (1.f + erff({x} * 0.7071067811865476f))",
        "gelu_tanh": f"0.5f * {x} * (1.f + tanhf(0.7978845608028654f * ({x} + 0.044715f * {x} * {x} * {x})))",
        "silu": f"{x} / (1.f + expf(-{x}))",
        "sigmoid": f"1.f / (1.f + expf(-{x}))",
        "tanh": f"tanhf({x})",
        "exp": f"expf({x})",
        "neg": f"-{x}",
        "abs": f"fabsf({x})",
        "rsqrt": f"rsqrtf({x})",
        "sqrt": f"sqrtf({x})",
        "log": f"logf({x})",
        "log1p": f"log1pf({x})",
        "expm1": f"expm1f({x})",
        "reciprocal": f"(1.f / {x})",
        "square": f"({x} * {x})",
        "erf": f"erff({x})",
        "sin": f"sinf({x})",
        "cos": f"cosf({x})",
        "hardsigmoid": f"(fminf(fmaxf({x} + 3.f, 0.f), 6.f) / 6.f)",
        "hardswish": f"({x} * fminf(fmaxf({x} + 3.f, 0.f), 6.f) / 6.f)",
        "mish": f"({x} * tanhf({x} > 20.f ? {x} : log1pf(expf({x}))))",
        "log_sigmoid_forward": f"(fminf({x}, 0.f) - log1pf(expf(-fabsf({x}))))",
        "sign": f"(({x} > 0.f) - ({x} < 0.f) + 0.f * {x})",
    }
    if op in table:
        return table[op]
    if op == "elu":  # elu(x, alpha, scale, input_scale); SELU is elu with its two constants
        alpha, scale, in_scale = (list(node.args[1:4]) + [1.0, 1.0, 1.0])[:3]
        if any(is_ref(a) or not isinstance(a, (int, float)) for a in (alpha, scale, in_scale)):
            return None
        neg = f"{literal(alpha)} * expm1f({x} * {literal(in_scale)})"
        return f"{literal(scale)} * ({x} > 0.f ? {x} : {neg})"
    if op == "softplus":  # log(1 + exp(beta x)) / beta, linear above the threshold, as torch does
        beta = node.args[1] if len(node.args) > 1 else node.kwarg("beta", 1.0)
        threshold = node.args[2] if len(node.args) > 2 else node.kwarg("threshold", 20.0)
        if is_ref(beta) or is_ref(threshold):
            return None
        bx = x if float(beta) == 1.0 else f"({literal(beta)} * {x})"
        soft = f"log1pf(expf({bx}))" if float(beta) == 1.0 else f"log1pf(expf({bx})) / {literal(beta)}"
        return f"({bx} > {literal(threshold)} ? {x} : {soft})"
    if op == "pow":  # a constant exponent; small integer powers as products (what torch computes for them)
        e = node.args[1] if len(node.args) > 1 else None
        if is_ref(e) or not isinstance(e, (int, float)) or isinstance(e, bool):
            return None
        if float(e) == 2.0:
            return f"({x} * {x})"
        if float(e) == 3.0:
            return f"({x} * {x} * {x})"
        if float(e) == 0.5:
            return f"sqrtf({x})"
        if float(e) == 1.0:
            return x
        return f"powf({x}, {literal(e)})"
    if op == "leaky_relu":
        slope = literal(node.args[1] if len(node.args) > 1 else 0.01)
        return f"({x} > 0.f ? {x} : {x} * {slope})"
    if op == "clamp_min" and len(node.args) > 1 and not is_ref(node.args[1]) and isinstance(node.args[1], (int, float)):
        return f"fmaxf({x}, {literal(node.args[1])})"
    if op in ("clamp", "hardtanh"):
        lo = node.args[1] if len(node.args) > 1 else node.kwarg("min", -1.0 if op == "hardtanh" else None)
        hi = node.args[2] if len(node.args) > 2 else node.kwarg("max", 1.0 if op == "hardtanh" else None)
        if is_ref(lo) or is_ref(hi):
            return None
        out = x if lo is None else f"fmaxf({x}, {literal(lo)})"
        return out if hi is None else f"fminf({out}, {literal(hi)})"
    return None


def _binary(op: str, node: OpNode, x: str, y: str) -> str | None:
    alpha = node.kwarg("alpha", 1)
    scaled = y if alpha == 1 else f"({literal(alpha)} * {y})"
    if op == "add":
        return f"{x} + {scaled}"
    if op == "sub":
        return f"{x} - {scaled}"
    if op == "mul":
        return f"{x} * {y}"
    if op == "div" and node.kwarg("rounding_mode") is None:
        return f"{x} / {y}"
    if op == "rsub":  # y - alpha * x
        return f"{y} - {x if alpha == 1 else f'({literal(alpha)} * {x})'}"
    if op == "xlogy":  # x * log(y), 0 where x is 0 (NaN y stays NaN)
        return f"(isnan({y}) ? {y} : ({x} == 0.f ? 0.f : {x} * logf({y})))"
    if op in ("maximum", "minimum"):  # a NaN on either side is the result, as torch has it (fmaxf drops it)
        return f"((isnan({x}) || isnan({y})) ? {x} + {y} : {'fmaxf' if op == 'maximum' else 'fminf'}({x}, {y}))"
    return None


UNARY = ("relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "exp", "neg", "abs", "rsqrt", "sqrt", "log", "log1p",
         "expm1", "reciprocal", "square", "erf", "sin", "cos", "hardsigmoid", "hardswish", "mish",
         "log_sigmoid_forward", "sign", "elu", "softplus", "pow", "leaky_relu", "clamp", "clamp_min", "hardtanh")
BINARY = ("add", "sub", "mul", "div", "rsub", "maximum", "minimum", "xlogy")
ELEMENTWISE = UNARY + BINARY + ("masked_fill", "triu", "tril")
CTYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}


# How a chain reads an operand of the output's own shape at row r, column c (a kernel that loads such
# operands another way, as 16-byte vectors, finds them by it).
ELEMENT_AT = "r * (long long)cols + c"


def per_16_bytes(dtype: str) -> int:
    """Elements of `dtype` (fp32, fp16 or bf16) in 16 bytes: one vector load, or a TMA row's alignment."""
    return 4 if dtype == "float32" else 8


# Each dtype as a user names it (--dtype), for the reasons a family gives.
DTYPE_NAMES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
# A value read from a tensor of each element type, as fp32.
TO_FLOAT = {"float16": "__half2float({})", "bfloat16": "__bfloat162float({})"}
# A cast (traced as _to_copy) to each dtype, applied to an fp32 value: rounded to it and widened back.
ROUND_TO = {"torch.float32": "{}", "torch.float16": "__half2float(__float2half_rn({}))",
            "torch.bfloat16": "__bfloat162float(__float2bfloat16_rn({}))"}


def structural_mask(problem: Problem, ref: str) -> tuple[int, int, str] | str:
    """A mask the forward builds from nothing (triu/tril of ones, possibly negated) as (R, C, a C
    condition on c and {i}, the row within the last two dims), or why `ref` is not one."""
    node = producer(problem, ref)
    if node is None:
        return f"the mask {ref} is not made inside the forward"
    if node.op == "_to_copy" and is_ref(node.args[0]):  # .bool() / .float() of a 0/1 mask keeps it
        return structural_mask(problem, node.args[0])
    if node.op in ("logical_not", "bitwise_not"):
        inner = structural_mask(problem, node.args[0]) if is_ref(node.args[0]) else "not a tensor"
        return inner if isinstance(inner, str) else (inner[0], inner[1], f"!({inner[2]})")
    if node.op in ("triu", "tril") and len(node.shape) == 2 and is_ref(node.args[0]):
        src = producer(problem, node.args[0])
        diag = node.args[1] if len(node.args) > 1 else node.kwarg("diagonal", 0)
        filled = src is not None and (src.op == "ones" or (src.op == "full" and len(src.args) > 1
                                                           and not is_ref(src.args[1]) and bool(src.args[1])))
        if not filled or not src.out.startswith("c") or not isinstance(diag, int) or isinstance(diag, bool):
            return f"{node.op} of something other than a tensor of ones with a constant diagonal"
        rows, cols = node.shape
        return rows, cols, f"c - {{i}} {'>=' if node.op == 'triu' else '<='} {diag}"
    return f"the mask {ref} comes from {node.op}, not from triu/tril of ones"


def _masked_fill(problem: Problem, node: OpNode, x: str, full: tuple[int, ...]) -> tuple[str, str]:
    """masked_fill by a structural mask as (C expression, "") - the fill value where the mask holds,
    else x - or ("", why not)."""
    mask, value = node.args[1], node.args[2] if len(node.args) > 2 else None
    if not is_ref(mask) or is_ref(value) or not isinstance(value, (int, float)):
        return "", "masked_fill needs a mask tensor and a constant fill value"
    found = structural_mask(problem, mask)
    if isinstance(found, str):
        return "", found
    rows, cols, cond = found
    if len(full) < 2 or tuple(full[-2:]) != (rows, cols):
        return "", f"masked_fill's {rows}x{cols} mask does not cover the last two dims of {list(full)}"
    return f"(({cond.replace('{i}', f'(int)(r % {rows})')}) ? {literal(value)} : {x})", ""


def mask_negations(problem: Problem, nodes: tuple[OpNode, ...]) -> dict[str, tuple[str, bool]]:
    """The nodes of a chain that only negate a bool input or buffer (~mask, logical_not) and are read
    by nothing but a masked_fill's mask or another such node, as {out: (the bool leaf, negated)}: the
    masked_fill reads the leaf itself, so the negation costs nothing and makes no tensor."""
    found: dict[str, tuple[str, bool]] = {}
    for n in nodes:
        if n.op not in ("bitwise_not", "logical_not") or not n.args or not is_ref(n.args[0]):
            continue
        src = n.args[0]
        if src in found:
            leaf, neg = found[src]
            found[n.out] = (leaf, not neg)
        elif (spec := leaf_spec(problem, src)) is not None and spec.dtype == "bool":
            found[n.out] = (src, True)
    if not found:
        return {}  # the scan below is over the whole graph, for every chain a partition's search tries
    readers = [(n, r) for n in problem.graph for r in refs_in(n) if r in found]
    return {ref: v for ref, v in found.items()
            if all((n.op == "masked_fill" and len(n.args) > 1 and n.args[1] == ref and n.args[0] != ref)
                   or n.out in found for n, r in readers if r == ref)
            and ref not in problem.graph_outputs}


def compile_chain(problem: Problem, nodes: tuple[OpNode, ...], anchor_out: str, full: tuple[int, ...],
                  dtype: str = "float32", allow_rowsum: bool = True, bias: str | None = None,
                  prefix: str = "e", result: str | None = None, channels: bool = False,
                  flat: bool = False, casts: bool = False, ends_inside: bool = False) -> Epilogue | str:
    """The chain after an anchor as an Epilogue, or why it is not one. `nodes` are the graph's nodes
    after the anchor; `full` is the anchor's output shape; leaf tensors must have `dtype`; a `bias`
    (a per-column vector, addmm's) is added first. The chain must end in the forward's output, or, for
    a prologue (a chain feeding another op), in `result`. `channels`: the anchor's output is [N, C, ...]
    (a convolution's) and the epilogue runs at r = n * C + c, column = the spatial offset: operands
    broadcast per element, per channel ("ch", as a bias does) or as one value; `bias` is per channel.
    `flat`: the kernel's r and c are a row and column of another view of the anchor's memory (a softmax
    over dims merged into one), so only r * cols + c, the flat index, means the same: every operand that
    is neither whole nor one value is indexed from it. `casts`: the chain may cast its value to another
    floating dtype and back (`h.to(x.dtype)` between fp32 steps), each rounding as PyTorch's would; the
    kernel then includes cuda_fp16.h and cuda_bf16.h."""
    if channels:
        allow_rowsum = False
    index = {"rc": ELEMENT_AT, "c": "c", "r": "r", "s": "0", "ch": f"(r % {full[1] if channels else 1})"}
    kind = (lambda shape: channel_kind(shape, full)) if channels else (lambda shape: broadcast_kind(shape, full))
    if flat:
        if channels or bias:
            raise ValueError("a flat-indexed chain has no channels and no bias")
        def kind(shape: tuple[int, ...]) -> str | None:
            k = broadcast_kind(shape, full)
            return k if k in ("rc", "s") else None
    env = {anchor_out: "v"}
    def load(x: str) -> str:
        return TO_FLOAT[dtype].format(x) if dtype in TO_FLOAT else x

    bias_kind = "ch" if channels else "c"
    lines: list[str] = [f"v = v + {load(prefix + '0[' + index[bias_kind] + ']')};"] if bias else []
    tensors: list[tuple[str, str]] = [(bias, bias_kind)] if bias else []
    rowsum = keepdim = False
    indexed = bias is not None
    views = leaf_views(problem, nodes)
    negations = mask_negations(problem, nodes)
    rotated = rotations(problem, nodes, full, UNARY, BINARY)
    interleaved = interleavings(problem, nodes, full, UNARY, BINARY)
    inside = frozenset().union(*(rot.nodes for rot in rotated.values()), *(il.nodes for il in interleaved.values()))
    masks: set[int] = set()

    def tensor_at(a: str, shape: tuple[int, ...]) -> tuple[int, str] | str:
        """The index of leaf `a` among the kernel's tensors and the C index of its element, or why not."""
        how = kind(shape)
        if how is not None:
            at = index[how]
        else:
            # Any other broadcast: the operand's index computed from the flat one, which an unindexed
            # kernel's r = 0, c = flat gives as well as real rows and columns do.
            at = broadcast_index(shape, full)
            if at is None:
                return f"{a} of shape {list(shape)} does not broadcast to {list(full)}"
            how = "b" + "x".join(map(str, shape))
        if (a, how) not in tensors:
            tensors.append((a, how))
        return tensors.index((a, how)), at

    def regrouped(shape: tuple[int, ...]) -> bool:
        """The chain's elements in the same order with the leading dims split or merged (a bmm's
        [48, S, S] viewed as [4, 12, S, S]): every operand still broadcasts over the last two dims,
        which stay, so the chain is computed over `full` as it is."""
        return (not channels and not flat and len(shape) >= 2 and len(full) >= 2 and shape[-2:] == full[-2:]
                and math.prod(shape) == math.prod(full))

    producers = {n.out: n for n in nodes}

    def at_column(ref: str, col: str) -> str:
        """A piece's value (see rotations) at column `col` of its row, as a C expression."""
        node = producers[ref]
        if node.op == "slice":
            leaf, start, _ = last_dim_slice(problem, node, full)  # type: ignore[misc]
            i, _ = tensor_at(leaf, full)  # type: ignore[misc]
            return load(f"{prefix}{i}[r * (long long)cols + ({col} + {start})]")
        inner_ref = next(a for a in node.args if is_ref(a))
        inner = at_column(inner_ref, col)
        if node.op in UNARY:
            return _unary(node.op, node, inner) or ""
        x, y = (literal(a) if not is_ref(a) else inner for a in node.args[:2])
        return _binary(node.op, node, x, y) or ""

    def at_half(ref: str, il: Interleave, col: str) -> str:
        """An interleaved piece's value at column `col` of row r of its half grid, as C ("" if not one)."""
        step, width = len(il.pieces), il.half[-1]
        node = producers.get(ref)
        if node is None or ref in views:  # a leaf (or a view of one) broadcast to the half grid
            leaf, shape = views.get(ref, (ref, None))
            spec = leaf_spec(problem, leaf)
            at = broadcast_index(tuple(shape or spec.shape), il.half) if spec is not None else None
            if at is None or spec.dtype != dtype:
                return ""
            how = "h" + "x".join(map(str, shape or spec.shape))  # indexed on the half grid, not the output
            if (leaf, how) not in tensors:
                tensors.append((leaf, how))
            at = at.replace("(r * (long long)cols + c)", f"(r * {width}LL + {col})")
            return load(f"{prefix}{tensors.index((leaf, how))}[{at}]")
        if node.op == "slice":
            leaf, start = strided_slice(problem, node, full, step)  # type: ignore[misc]
            i, _ = tensor_at(leaf, full)  # type: ignore[misc]
            return load(f"{prefix}{i}[r * (long long)cols + ({step} * {col} + {start})]")
        args = node.args[:1] if node.op in UNARY else node.args[:2]
        values = [at_half(a, il, col) if is_ref(a) else literal(a) for a in args]
        if not all(values):
            return ""
        return (_unary(node.op, node, values[0]) if node.op in UNARY else _binary(node.op, node, *values)) or ""

    for k, node in enumerate(nodes):
        if node.out in interleaved:  # column c: piece c % P at column c / P of the half grid
            il = interleaved[node.out]
            parts = [at_half(piece, il, f"(c / {len(il.pieces)})") for piece in il.pieces]
            if not all(parts):
                return "an interleaved piece with an op or operand no chain computes"
            expr = parts[-1]
            for p in reversed(range(len(parts) - 1)):
                expr = f"(c % {len(parts)} == {p} ? {parts[p]} : {expr})"
            indexed = True
            lines.append(f"const float x{k} = {expr};")
            env[node.out] = f"x{k}"
            continue
        if node.out in views or node.out in negations or node.out in inside:
            continue  # a view of a leaf, a negated mask, a rotation's piece: read where it is used
        if node.out in rotated:  # column c of the concatenation: the piece it falls in, at its own column
            expr, offset = "0.f", 0
            parts = []
            for piece, width in rotated[node.out].pieces:
                parts.append((offset, width, at_column(piece, "c" if offset == 0 else f"(c - {offset})")))
                offset += width
            if any(not e for _, _, e in parts):
                return "a concatenated piece with an op no chain computes"
            expr = parts[-1][2]
            for start, width, e in reversed(parts[:-1]):
                expr = f"(c < {start + width} ? {e} : {expr})"
            indexed = True
            lines.append(f"const float x{k} = {expr};")
            env[node.out] = f"x{k}"
            continue
        if node.op in LEAF_VIEWS and node.args and is_ref(node.args[0]) and node.args[0] in env \
                and regrouped(tuple(node.shape)):
            env[node.out] = env[node.args[0]]
            continue
        if allow_rowsum and _is_row_sum(node, full) and node.args[0] in env:
            # The sum may only be scaled by constants after it: folded in before the sum (it is linear).
            value, prev = env[node.args[0]], node.out
            for j, t in enumerate(nodes[k + 1:], start=k + 1):
                factor = constant_scale(t, prev)
                if factor is None:
                    return f"{t.op} after the row sum is not a scale by a constant"
                lines.append(f"const float x{j} = {value} * {literal(factor)};")
                value, prev = f"x{j}", t.out
            rowsum, keepdim = True, node.op == "sum"
            env[prev] = value
            break
        if casts and node.op == "_to_copy" and node.args and node.args[0] in env:
            target = node.kwarg("dtype")
            others = {k for k, _ in node.kwargs} - {"dtype"}
            if target not in ROUND_TO or others or tuple(node.shape) != full:
                return f"a cast to {target} is not one a chain computes"
            lines.append(f"const float x{k} = {ROUND_TO[target].format(env[node.args[0]])};")
            env[node.out] = f"x{k}"
            continue
        if node.op == "empty" and node.out.startswith("c") and not any(
                node.out in (a.partition(".")[0] for a in refs_in(n)) for n in nodes[k + 1:]):
            continue  # a placeholder the trace records beside a batch norm, read by nothing
        if node.op == "native_batch_norm" and node.args and node.args[0] in env:
            # Eval mode (running statistics): per channel (dim 1), (v - mean) / sqrt(var + eps) * w + b.
            expr = _eval_batch_norm(problem, node, env[node.args[0]], full, dtype, channels, prefix, tensors, load)
            if expr.startswith("!"):
                return expr[1:]
            lines.append(f"const float x{k} = {expr};")
            env[node.out] = f"x{k}"
            continue
        if node.op not in ELEMENTWISE:
            return f"{node.op} after the anchor is not an elementwise epilogue op"
        if kind(tuple(node.shape)) is None and not regrouped(tuple(node.shape)):
            # A value that broadcasts to the output (an op on a per-column operand, say) is computed
            # per output element: the same value at every element it broadcasts to.
            return f"{node.op} changes the shape to {list(node.shape)}"
        if (channels or flat) and node.op in ("triu", "tril", "masked_fill"):
            return f"{node.op} after a convolution" if channels else f"{node.op} over merged dims"
        if node.op in ("triu", "tril"):  # zero below (above) a diagonal of each matrix in the last two dims
            diag = node.args[1] if len(node.args) > 1 else node.kwarg("diagonal", 0)
            if not is_ref(node.args[0]) or node.args[0] not in env:
                return f"{node.op} of something other than the chain's value"
            if not isinstance(diag, int) or isinstance(diag, bool) or len(full) < 2 or tuple(node.shape) != full:
                return f"{node.op} without a constant diagonal over the last two dims"
            keep = f"(c - (long long)(r % {full[-2]})) {'>=' if node.op == 'triu' else '<='} {diag}"
            indexed = True
            lines.append(f"const float x{k} = ({keep}) ? {env[node.args[0]]} : 0.f;")
            env[node.out] = f"x{k}"
            continue
        if node.op == "masked_fill":
            if not is_ref(node.args[0]) or node.args[0] not in env:
                return "masked_fill of something other than the chain's value"
            mask, value = node.args[1] if len(node.args) > 1 else None, node.args[2] if len(node.args) > 2 else None
            leaf, negated = negations.get(mask, (mask, False)) if is_ref(mask) else (None, False)
            spec = leaf_spec(problem, leaf) if leaf is not None else None
            if spec is not None and spec.dtype == "bool" and isinstance(value, (int, float)) and not is_ref(value):
                # A mask the model holds (GPT-2's causal buffer) or is given: read as bool where it broadcasts.
                found = tensor_at(leaf, tuple(spec.shape))
                if isinstance(found, str):
                    return f"masked_fill's mask {found}"
                i, at = found
                masks.add(i)
                indexed = indexed or tensors[i][1] in ("r", "c", "ch")
                cond = f"{'!' if negated else ''}{prefix}{i}[{at}]"
                lines.append(f"const float x{k} = {cond} ? {literal(value)} : {env[node.args[0]]};")
                env[node.out] = f"x{k}"
                continue
            expr, why = _masked_fill(problem, node, env[node.args[0]], full)
            indexed = True
            if why:
                return why
            lines.append(f"const float x{k} = {expr};")
            env[node.out] = f"x{k}"
            continue
        operands: list[str] = []
        tensor_args = [a for a in node.args if is_ref(a)]
        for a in node.args[: 2 if node.op in BINARY else 1]:
            if not is_ref(a):
                if isinstance(a, (int, float)):  # bools too
                    operands.append(literal(a))
                    continue
                return f"{node.op} has a non-numeric operand {a!r}"
            if a in env:
                operands.append(env[a])
                continue
            a, view_shape = views.get(a, (a, None))
            spec = leaf_spec(problem, a)
            if spec is None:
                return f"{node.op} reads {a}, which is neither an input, a parameter nor part of the chain"
            if spec.dtype != dtype:
                return f"{node.op} reads {a} of dtype {spec.dtype} (the kernel computes {dtype})"
            shape = view_shape if view_shape is not None else tuple(spec.shape)
            found = tensor_at(a, shape)
            if isinstance(found, str):
                return f"{node.op} reads {found}"
            i, at = found
            indexed = indexed or tensors[i][1] in ("r", "c", "ch")
            operands.append(load(f"{prefix}{i}[{at}]"))
        if not tensor_args:
            return f"{node.op} reads no tensor"
        expr = _unary(node.op, node, operands[0]) if len(operands) == 1 else _binary(node.op, node, *operands)
        if expr is None:
            return f"{node.op} with these arguments is not supported in an epilogue"
        name = f"x{k}"
        lines.append(f"const float {name} = {expr};")
        env[node.out] = name
    last = nodes[-1].out if nodes else anchor_out
    # A chain may pass through a regrouped view, but one that makes the kernel's output ends in the
    # anchor's shape: the output is declared in it, and an op after the kernel (a transpose of the
    # [B, H, S, D] view) reads that shape. `ends_inside`: the end feeds the kernel's next step (a
    # softmax over the same rows, a whole-tensor sum), where the grouping of leading dims is moot.
    end = tuple(nodes[-1].shape) if nodes else full
    if nodes and not rowsum and end != full and not (ends_inside and regrouped(end)):
        return f"the chain's result has shape {list(nodes[-1].shape)}, not the anchor's {list(full)}"
    if result is None:
        outs = problem.graph_outputs
        if len(outs) != 1 or outs[0] != last:
            return "the forward's output is not the end of the chain"
    elif result != last:
        return f"the chain ends in {last}, not in {result}"
    if last not in env:  # the chain's end is a view of a leaf (an input reshaped), read where it is used
        return "the chain ends in a view of an input, not in a computed value"
    value = env[last]
    body = "\n".join(lines + ([f"v = {value};"] if value != "v" else []))
    return Epilogue(body, tuple(tensors), rowsum, keepdim, prefix, CTYPES.get(dtype, "float"), indexed, frozenset(masks))


def _eval_batch_norm(problem: Problem, node: OpNode, value: str, full: tuple[int, ...], dtype: str, channels: bool,
                     prefix: str, tensors: list[tuple[str, str]], load: Any) -> str:
    """An eval-mode batch norm of the chain's value as a C expression, its per-channel operands added to
    `tensors`; or "!" and why it is not one."""
    args = (tuple(node.args) + (None,) * 8)[:8]
    _, weight, bias, mean, var, training, _, eps = args
    if training is not False or not isinstance(eps, (int, float)) or isinstance(eps, bool):
        return "!a batch norm in training mode (its statistics come from the batch)"
    if len(full) < 2 or tuple(node.shape) != full or mean is None or var is None:
        return "!a batch norm without running statistics over dim 1 of the chain's value"
    spatial = math.prod(full[2:])
    # The channel of the element at row r, column c: in a convolution's epilogue r runs over (image,
    # channel); elsewhere r * cols + c is the flat index.
    at = f"(r % {full[1]})" if channels else f"((r * (long long)cols + c) / {spatial}LL % {full[1]})"
    loads = {}
    for name, ref in (("w", weight), ("b", bias), ("m", mean), ("v", var)):
        if ref is None:
            continue
        spec = leaf_spec(problem, ref) if is_ref(ref) else None
        if spec is None or tuple(spec.shape) != (full[1],) or spec.dtype != dtype:
            return f"!a batch norm whose {name} is not a {dtype} vector over the {full[1]} channels"
        if (ref, "bn_ch") not in tensors:
            tensors.append((ref, "bn_ch"))
        loads[name] = load(f"{prefix}{tensors.index((ref, 'bn_ch'))}[{at}]")
    expr = f"({value} - {loads['m']}) * rsqrtf({loads['v']} + {literal(eps)})"
    if "w" in loads:
        expr = f"{expr} * {loads['w']}"
    if "b" in loads:
        expr = f"{expr} + {loads['b']}"
    return f"({expr})"


def _is_row_sum(node: OpNode, full: tuple[int, ...]) -> bool:
    """A sum over the last dim of the chain's value (traced as sum_lastdim, or as sum with keepdim)."""
    if node.op == "sum_lastdim":
        return len(full) >= 1
    if node.op != "sum" or len(node.args) < 3 or node.args[2] is not True or node.kwarg("dtype") is not None or not full:
        return False
    return is_last_dim(node.args[1], len(full))


def constant_scale(node: OpNode, prev: str) -> float | None:
    """The factor of a multiply or divide of `prev` by a constant, else None."""
    if len(node.args) < 2 or node.args[0] != prev or is_ref(node.args[1]) or not isinstance(node.args[1], (int, float)) \
            or isinstance(node.args[1], bool):
        return None
    if node.op == "mul":
        return float(node.args[1])
    if node.op == "div" and node.kwarg("rounding_mode") is None and node.args[1] != 0:
        return 1.0 / float(node.args[1])
    return None
