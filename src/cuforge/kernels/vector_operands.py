"""A pointwise chain's operands read as vectors. A chain reads each operand one element at a time
(`e1[index]`), which for a thread that handles VEC consecutive elements of a row is VEC scalar loads an
operand: in fp16/bf16 eight 2-byte loads where one 16-byte load would do, and LLaMA's rotary embedding
(q, its rotated partner, cos and sin) issued four times the load instructions of its memory traffic.

Each distinct read `e{i}[index]` becomes a slot loaded once per vector, at the vector's first column c0:
- uniform: the index is the same for the VEC elements (a per-row operand, a broadcast last dim): one
  element, read once;
- contiguous: the index is index(c0) + j for element j, and index(c0) is a multiple of VEC (an operand of
  the output's shape, a per-column one, cos/sin broadcast over heads, the rotated half of a row): one
  aligned vector load.
Any other read (interleaved pairs at VEC > 2, a mask) and the chain is not vectorized. Which class an
index falls in is proved from its C expression, not sampled: the chain compiler writes indices from
r, c, cols, integer constants, + - * / %, and an abstract evaluation over those (below) tracks whether a
value is constant across an aligned vector of a row or c plus such a constant.

A slot's load reads index(c0) only where the whole vector lies inside its tensor (else its first
element, harmlessly): a read that the chain's select (c < h ? ... : ...) does not take at these columns
may point past the tensor, and when index(c0) is a multiple of VEC and the tensor's size is too, any
element the select does take lies inside it."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import lru_cache

from cuforge.kernels.chains import Epilogue


@dataclass(frozen=True)
class VectorOperands:
    preload: str  # C statements at row r, first column c0: one register slot per distinct read
    body: str  # the chain's body with each read taken from its slot, for element j (column c = c0 + j)
    aligned: str  # C condition on the tensor pointers: every vector-read tensor aligned for one load
    vectors: int  # slots read as vectors (0: vectorizing gains nothing but fewer index computations)


@dataclass(frozen=True)
class _Value:
    kind: str  # "const": the same for every element of an aligned vector; "lin": that plus c; "other"
    multiple: bool = False  # const: a multiple of VEC; lin: its constant part is one
    nonneg: bool = True  # never negative (C's / and % truncate: only then is a block's quotient constant)


_OTHER = _Value("other", False, False)


def _classify(node: ast.AST, vec: int, cols: int) -> _Value:
    """The class of an index expression over one aligned vector of VEC columns of a row."""
    if isinstance(node, ast.Expression):
        return _classify(node.body, vec, cols)
    if isinstance(node, ast.Name):
        if node.id == "c":
            return _Value("lin", True)
        if node.id == "r":
            return _Value("const", False)
        if node.id == "cols":
            return _Value("const", cols % vec == 0)
        return _OTHER
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return _Value("const", node.value % vec == 0, node.value >= 0)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        x = _classify(node.operand, vec, cols)
        return _Value("const", x.multiple, False) if x.kind == "const" else _OTHER
    if not isinstance(node, ast.BinOp):
        return _OTHER
    a, b = _classify(node.left, vec, cols), _classify(node.right, vec, cols)
    if "other" in (a.kind, b.kind):
        return _OTHER
    if a.kind == "lin" and b.kind == "lin":  # 2c, or c - c: no longer one element a column
        return _OTHER
    if isinstance(node.op, (ast.Add, ast.Sub)):
        sub = isinstance(node.op, ast.Sub)
        if a.kind == "const" and b.kind == "const":
            return _Value("const", a.multiple and b.multiple, a.nonneg and b.nonneg and not sub)
        if b.kind == "lin":  # c on the right: c + k, or k - c (not c plus a constant)
            return _Value("lin", a.multiple and b.multiple, a.nonneg and b.nonneg) if not sub else _OTHER
        return _Value("lin", a.multiple and b.multiple, a.nonneg and b.nonneg and not sub)
    if isinstance(node.op, ast.Mult):
        if a.kind == "const" and b.kind == "const":
            return _Value("const", a.multiple or b.multiple, a.nonneg and b.nonneg)
        unit = node.right if a.kind == "lin" else node.left
        if isinstance(unit, ast.Constant) and unit.value == 1:
            return a if a.kind == "lin" else b
        return _OTHER
    if isinstance(node.op, (ast.FloorDiv, ast.Mod)):
        if not (a.nonneg and b.nonneg):
            return _OTHER
        if a.kind == "const" and b.kind == "const":
            return _Value("const", False, True)
        k = node.right
        if a.kind == "lin" and a.multiple and isinstance(k, ast.Constant) and isinstance(k.value, int) \
                and k.value > 0 and k.value % vec == 0:
            # An aligned vector of c lies inside one block of k: the quotient is the same for all of it,
            # and the remainder is c plus a multiple of VEC.
            return _Value("const", False, True) if isinstance(node.op, ast.FloorDiv) else _Value("lin", True, True)
        return _OTHER
    return _OTHER


def _parse_index(index: str) -> ast.AST | None:
    """The chain compiler's C index as a Python expression tree ((long long) casts and LL suffixes
    dropped; C's integer / as //, here only over non-negative values), or None."""
    text = index.replace("(long long)", "")
    text = re.sub(r"(\d+)LL\b", r"\1", text)
    if re.search(r"[^\w\s()+\-*/%]", text):
        return None
    text = text.replace("/", "//")
    try:
        return ast.parse(text, mode="eval")
    except SyntaxError:
        return None


def index_class(index: str, vec: int, cols: int) -> str:
    """'uniform', 'contiguous' or 'other' for one read's C index (see the module's docstring)."""
    tree = _parse_index(re.sub(r"\bcols\b", str(cols), index))
    if tree is None:
        return "other"
    v = _classify(tree, vec, cols)
    if v.kind == "const":
        return "uniform"
    if v.kind == "lin" and v.multiple:
        return "contiguous"
    return "other"


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
    slots: dict[tuple[int, str], tuple[str, str]] = {}  # (tensor, index) -> (slot name, class)
    preload: list[str] = []
    vector_tensors: set[int] = set()
    for _, _, i, index in reads:
        if (i, index) in slots:
            continue
        how = index_class(index, vec, cols)
        if how == "other":
            return f"{chain.prefix}{i}[{index}] is neither the same nor consecutive over {vec} columns"
        at = re.sub(r"\bc\b", "c0", index)
        k = len(slots)
        e = f"{chain.prefix}{i}"
        if how == "uniform":
            name = f"u{k}"
            preload.append(f"const long long at{k} = {at};")
            preload.append(f"const {chain.ctype} {name} = {e}[(at{k} >= 0 && at{k} < {numels[i]}LL) ? at{k} : 0];")
        else:
            if numels[i] % vec:
                return f"{e} of {numels[i]} elements is not whole vectors of {vec}"
            name = f"q{k}"
            vector_tensors.add(i)
            preload.append(f"const long long at{k} = {at};")
            preload.append(f"const opv_t {name} = *reinterpret_cast<const opv_t*>("
                           f"{e} + ((at{k} >= 0 && at{k} + {vec} <= {numels[i]}LL) ? at{k} : 0));")
            name += ".e[j]"
        slots[(i, index)] = (name, how)
    body, last = [], 0
    for start, end, i, index in reads:
        body.append(chain.body[last:start])
        body.append(slots[(i, index)][0])
        last = end
    body.append(chain.body[last:])
    pointers = " | ".join(f"reinterpret_cast<unsigned long long>({chain.prefix}{i})" for i in sorted(vector_tensors))
    aligned = f"(({pointers}) % (unsigned long long)sizeof(opv_t)) == 0" if pointers else "true"
    return VectorOperands("\n".join(preload), "".join(body), aligned, len(vector_tensors))
