"""A pointwise chain's operands read once per vector. A chain reads each operand one element at a time
(`e1[index]`), which for a thread that handles VEC consecutive elements of a row is VEC scalar loads an
operand: in fp16/bf16 eight 2-byte loads where one 16-byte load would do, and LLaMA's rotary embedding
(q, its rotated partner, cos and sin) issued four times the load instructions of its memory traffic.

Each distinct read `e{i}[index]` becomes a slot loaded once per vector, at the vector's first column c0,
from where element j (column c0 + j) finds its value at a fixed place:
- uniform: the index is the same for the VEC elements (a per-row operand, a broadcast last dim): one
  element;
- a vector of W elements (W a power of two up to VEC): index(c0 + j) = index(c0) + d[j] with d[j] in
  [0, W) the same for every vector, and index(c0) a multiple of W: one aligned load of W elements.
  An operand of the output's shape, a per-column one, cos and sin broadcast over heads and the rotated
  half of a row have d[j] = j (W = VEC); an interleaved pair's q reads 2 (j / 2) + 0 or 1, and its
  half-width cos/sin table j / 2 (W = VEC / 2).
Any other read (a mask, a table whose rows no vector divides) and the chain is not vectorized. That a
read falls in a class is proved from its C expression, not sampled: the chain compiler writes indices
from r, c, cols, integer constants, + - * / %, and an abstract evaluation over those (_classify)
tracks whether a value is the same over an aligned vector of a row, or such a value plus an offset that
depends on j alone, and what power of two divides the part that is the same.

A slot read only inside a branch of a select on the column (c < h ? ... : ..., h a multiple of VEC: the
same branch for the whole vector) is loaded only where its vector takes that branch: rotate_half reads
one partner half a vector, not both. A slot's load reads index(c0) only where all W elements lie inside
its tensor (else its first W, harmlessly): a read that the chain's select (c < h ? ... : ...) does not
take at these columns may point past the tensor, and when index(c0) is a multiple of W and the tensor's
size is too, any element the select does take lies inside it."""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass
from functools import lru_cache

from cuforge.kernels.chains import Epilogue


@dataclass(frozen=True)
class VectorOperands:
    decls: str  # C: the slot types (an aligned struct of W elements for each width W used)
    preload: str  # C statements at row r, first column c0: one register slot per distinct read
    body: str  # C: the chain once per element j (column c = c0 + j), each read taken from its slot
    aligned: str  # C condition on the tensor pointers: every vector-read tensor aligned for VEC elements
    vectors: int  # slots read as vectors (0: vectorizing gains nothing but fewer index computations)


@dataclass(frozen=True)
class _Value:
    # "same": the same for every element of an aligned vector of a row; "offset": a "same" part plus an
    # offset that depends only on the element's place j in the vector, from 0 to `spread`; "other".
    kind: str
    align: int = 1  # a divisor of VEC known to divide the "same" part
    nonneg: bool = True  # never negative (C's / and % truncate toward zero: only then is a block's quotient fixed)
    spread: int = 0


_OTHER = _Value("other", 1, False)


def _literal(node: ast.AST) -> int | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    return None


def _classify(node: ast.AST, vec: int) -> _Value:
    """The class of an index expression (cols already a literal) over one aligned vector of `vec` columns."""
    if isinstance(node, ast.Expression):
        return _classify(node.body, vec)
    if isinstance(node, ast.Name):
        return {"c": _Value("offset", vec, True, vec - 1), "r": _Value("same", 1, True)}.get(node.id, _OTHER)
    k = _literal(node)
    if k is not None:
        return _Value("same", math.gcd(k, vec), k >= 0)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        x = _classify(node.operand, vec)
        return _Value("same", x.align, False) if x.kind == "same" else _OTHER
    if not isinstance(node, ast.BinOp):
        return _OTHER
    a, b = _classify(node.left, vec), _classify(node.right, vec)
    if "other" in (a.kind, b.kind) or (a.kind == b.kind == "offset"):
        return _OTHER
    if isinstance(node.op, (ast.Add, ast.Sub)):
        sub = isinstance(node.op, ast.Sub)
        align, nonneg = math.gcd(a.align, b.align), a.nonneg and b.nonneg and not sub
        if a.kind == b.kind == "same":
            return _Value("same", align, nonneg)
        if b.kind == "offset" and sub:  # k - c: the offset counts down
            return _OTHER
        off, other = (a, node.right) if a.kind == "offset" else (b, node.left)
        k = _literal(other)
        if k is not None:  # a constant's part below the alignment joins the offset: 2 (c / 2) + 1
            k = -k if sub else k
            return _Value("offset", off.align, nonneg, off.spread + k % off.align)
        return _Value("offset", align, nonneg, off.spread)
    if isinstance(node.op, ast.Mult):
        if a.kind == b.kind == "same":
            return _Value("same", math.gcd(a.align * b.align, vec), a.nonneg and b.nonneg)
        off, k = (a, _literal(node.right)) if a.kind == "offset" else (b, _literal(node.left))
        if k is None or k <= 0:  # r * c, or a negative scale: the offset would depend on the row or count down
            return _OTHER
        return _Value("offset", math.gcd(off.align * k, vec), off.nonneg, off.spread * k)
    if isinstance(node.op, (ast.FloorDiv, ast.Mod)):
        if not (a.nonneg and b.nonneg):
            return _OTHER
        if a.kind == b.kind == "same":
            return _Value("same", 1, True)
        k = _literal(node.right)
        if a.kind != "offset" or k is None or k <= 0:
            return _OTHER
        if isinstance(node.op, ast.FloorDiv):
            if a.align % k == 0:  # (s + d) / k = s / k + d / k when k divides s
                spread = a.spread // k
                return _Value("offset", a.align // k, True, spread) if spread else _Value("same", 1, True)
            if k % a.align == 0 and a.spread < a.align:  # s + d inside one block of k: the quotient is s / k
                return _Value("same", 1, True)
            return _OTHER
        # (s + d) % k = s % k + d when k is a multiple of s's alignment and d stays below it.
        if k % a.align or a.spread >= a.align:
            return _OTHER
        return _Value("offset", a.align, True, a.spread)
    return _OTHER


def _parse_index(index: str, cols: int) -> ast.AST | None:
    """The chain compiler's C index as a Python expression tree (cols as its value, (long long) casts and
    LL suffixes dropped, C's integer / as //), or None."""
    text = re.sub(r"\bcols\b", str(cols), index.replace("(long long)", ""))
    text = re.sub(r"(\d+)LL\b", r"\1", text)
    if re.search(r"[^\w\s()+\-*/%]", text):
        return None
    try:
        return ast.parse(text.replace("/", "//"), mode="eval")
    except SyntaxError:
        return None


def _c_value(node: ast.AST, r: int, c: int) -> int:
    """The index's value with C's integer semantics (division and remainder truncate toward zero)."""
    if isinstance(node, ast.Expression):
        return _c_value(node.body, r, c)
    if isinstance(node, ast.Name):
        return {"r": r, "c": c}[node.id]
    k = _literal(node)
    if k is not None:
        return k
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_c_value(node.operand, r, c)
    assert isinstance(node, ast.BinOp)
    x, y = _c_value(node.left, r, c), _c_value(node.right, r, c)
    if isinstance(node.op, ast.Add):
        return x + y
    if isinstance(node.op, ast.Sub):
        return x - y
    if isinstance(node.op, ast.Mult):
        return x * y
    q = abs(x) // abs(y) * (1 if (x >= 0) == (y >= 0) else -1)
    return q if isinstance(node.op, ast.FloorDiv) else x - q * y


@dataclass(frozen=True)
class IndexClass:
    width: int  # elements loaded: 1 for a read that is the same over the vector, else W
    offsets: tuple[int, ...]  # element j's place in the load


def index_class(index: str, vec: int, cols: int) -> IndexClass | None:
    """How one read's C index runs over an aligned vector of `vec` columns (see the module's docstring),
    or None where it is neither the same nor inside one aligned load."""
    tree = _parse_index(index, cols)
    if tree is None:
        return None
    v = _classify(tree, vec)
    if v.kind == "same":
        return IndexClass(1, (0,) * vec)
    if v.kind != "offset":
        return None
    width = 1 << v.spread.bit_length()  # the smallest power of two above the spread
    if width > vec or v.align % width:
        return None
    # The offsets are the same for every vector (proved above): those of the first one, from the
    # multiple of the width below its first element (the part that is the same).
    first = _c_value(tree, 0, 0)
    offsets = tuple(_c_value(tree, 0, j) - (first - first % width) for j in range(vec))
    if not all(0 <= d < width for d in offsets):  # the proof's promise, checked where it is used
        return None
    return IndexClass(width, offsets)


def _reads(body: str, prefix: str) -> list[tuple[int, int, int, str]] | str:
    """Every tensor read in the body as (start, end, tensor, index), or why they cannot be listed."""
    out = []
    for m in re.finditer(rf"\b{re.escape(prefix)}(\d+)\[", body):
        depth, k = 1, m.end()
        while k < len(body) and depth:
            depth += {"[": 1, "]": -1}.get(body[k], 0)
            k += 1
        if depth:
            return "an unclosed index"
        index = body[m.end():k - 1]
        if "[" in index:
            return "a read inside another read's index"
        out.append((m.start(), k, int(m.group(1)), index))
    return out


def _column_conditions(body: str, vec: int) -> list[tuple[int, int, str]]:
    """The spans of the body that run only under a condition on the column the same over an aligned
    vector: each branch of a select `(c < N ? A : B)` with N a multiple of VEC (a rotation's pieces, as the
    chain compiler writes them), as (start, end, the condition at the vector's first column c0)."""
    spans = []
    for m in re.finditer(r"\(c < (\d+) \? ", body):
        bound = int(m.group(1))
        if bound % vec:
            continue
        depth, k, colon = 0, m.end(), -1
        while k < len(body):
            ch = body[k]
            if ch in "([":
                depth += 1
            elif ch in ")]":
                if depth == 0:
                    break
                depth -= 1
            elif ch == ":" and depth == 0 and colon < 0:  # a nested select's : sits inside its own parentheses
                colon = k
            k += 1
        if colon < 0 or k >= len(body):
            continue
        spans.append((m.end(), colon, f"c0 < {bound}"))
        spans.append((colon + 1, k, f"c0 >= {bound}"))
    return spans


def _guard(positions: list[int], spans: list[tuple[int, int, str]]) -> str | None:
    """The condition under which any of the reads at `positions` runs (None: one runs always)."""
    alternatives = []
    for at in positions:
        conditions = [cond for start, end, cond in spans if start <= at < end]
        if not conditions:
            return None
        alternatives.append("(" + " && ".join(conditions) + ")")
    return " || ".join(dict.fromkeys(alternatives))


@lru_cache(maxsize=256)
def vector_operands(chain: Epilogue, vec: int, cols: int, numels: tuple[int, ...]) -> VectorOperands | str:
    """`chain` (a pointwise chain's epilogue; its tensors of `numels` elements each) with every operand
    read once per vector of `vec` columns (rows of `cols`), or why it cannot be."""
    if vec < 2 or cols % vec:
        return f"rows of {cols} are not whole vectors of {vec}"
    if chain.masks:
        return "the chain reads a mask"
    reads = _reads(chain.body, chain.prefix)
    if isinstance(reads, str):
        return reads
    slots: dict[tuple[int, str], tuple[str, IndexClass]] = {}  # (tensor, index) -> (slot, class)
    preload: list[str] = []
    # A slot read only in a branch its vector does not take (rotate_half's partner at c + h where c >= h)
    # is not loaded there.
    spans = _column_conditions(chain.body, vec)
    where: dict[tuple[int, str], list[int]] = {}
    for start, _, i, index in reads:
        where.setdefault((i, index), []).append(start)
    widths: set[int] = set()
    vector_tensors: set[int] = set()
    for _, _, i, index in reads:
        if (i, index) in slots:
            continue
        how = index_class(index, vec, cols)
        e = f"{chain.prefix}{i}"
        if how is None:
            return f"{e}[{index}] is neither the same over {vec} columns nor inside one aligned load"
        k = len(slots)
        at = re.sub(r"\bc\b", "c0", index)
        if how.width == 1:
            preload.append(f"const long long at{k} = {at};")
            preload.append(f"const {chain.ctype} u{k} = {e}[(at{k} >= 0 && at{k} < {numels[i]}LL) ? at{k} : 0];")
            slots[(i, index)] = (f"u{k}", how)
            continue
        if numels[i] % how.width:
            return f"{e} of {numels[i]} elements is not whole vectors of {how.width}"
        w = how.width
        preload.append(f"const long long at{k} = ({at}) & ~{w - 1}LL;  // the aligned load holding the vector's elements")
        widths.add(w)
        vector_tensors.add(i)
        load = (f"*reinterpret_cast<const opv{w}_t*>({e} + ((at{k} >= 0 && at{k} + {w} <= {numels[i]}LL) ? at{k} : 0))")
        guard = _guard(where[(i, index)], spans)
        if guard is None:
            preload.append(f"const opv{w}_t q{k} = {load};")
        else:
            preload.append(f"opv{w}_t q{k} = {{}};")
            preload.append(f"if ({guard}) q{k} = {load};")
        slots[(i, index)] = (f"q{k}", how)
    blocks = []
    for j in range(vec):
        text, last = [], 0
        for start, end, i, index in reads:
            name, how = slots[(i, index)]
            text.append(chain.body[last:start])
            text.append(name if how.width == 1 else f"{name}.e[{how.offsets[j]}]")
            last = end
        text.append(chain.body[last:])
        inner = "\n".join("    " + line for line in "".join(text).splitlines())
        blocks.append(f"{{\n    const long long c = c0 + {j};\n    (void)c;\n    float v = vv[{j}];\n{inner}\n    vv[{j}] = v;\n}}")
    decls = "\n".join(f"struct __align__({w} * sizeof({chain.ctype})) opv{w}_t {{ {chain.ctype} e[{w}]; }};"
                      for w in sorted(widths))
    pointers = " | ".join(f"reinterpret_cast<unsigned long long>({chain.prefix}{i})" for i in sorted(vector_tensors))
    aligned = f"(({pointers}) % ({vec}ULL * sizeof({chain.ctype}))) == 0" if pointers else "true"
    return VectorOperands(decls, "\n".join(preload), "\n".join(blocks), aligned, len(vector_tensors))
