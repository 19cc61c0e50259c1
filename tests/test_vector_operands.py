"""A pointwise chain's operands read once per vector (kernels/vector_operands.py, the pointwise family's
knob OPVEC): which C indices are the same or consecutive over an aligned vector (proved from the
expression, and checked here against every element of small grids), the vectorized chain run on the
CPU against PyTorch, every dtype compiled with NVRTC, and the refusals."""

import re

import pytest

from cuforge.kernels.pointwise import PointwiseChain, match_pointwise, operand_vectors
from cuforge.kernels.vector_operands import index_class
from template_helpers import host_library, problem_from_expr, run_on_host, smoke_compile

COLS = 128


@pytest.mark.parametrize("index, vec, width", [
    ("r * (long long)cols + c", 4, 4),  # an operand of the output's shape
    ("c", 8, 8),  # per column
    ("r", 8, 1),  # per row: the same over the vector
    ("0", 4, 1),  # one value
    ("((r * (long long)cols + c) % 131072LL)", 8, 8),  # cos/sin broadcast over batch and heads
    ("((r * (long long)cols + c) % 130LL)", 4, None),  # a table whose rows no vector divides
    ("r * (long long)cols + (c + 64)", 8, 8),  # the rotated half, read in place
    ("r * (long long)cols + ((c - 64) + 0)", 8, 8),
    ("r * (long long)cols + (c + 2)", 4, None),  # elements of two aligned loads
    ("r * 64LL + (c / 2)", 2, 1),  # an interleaved pair's table entry: the same for the pair
    ("r * 64LL + (c / 2)", 8, 4),  # ... four entries for four pairs
    ("r * (long long)cols + (2 * (c / 2) + 1)", 8, 8),  # a pair's odd element, inside the vector's own load
    ("r * 63LL + (c / 2)", 8, None),  # rows of the table that no load of four divides
    ("(((r * (long long)cols + c) / 4096LL) % 16LL) * 1LL", 4, 1),  # per (batch, head)
    ("((c - 3) / 4LL)", 4, None),  # C truncates a negative quotient toward zero
    ("2 * c", 4, None),
    ("r * c", 4, None),
    ("c * c", 4, None),
    ("c + c", 4, None),
    ("64 - c", 4, None),
    ("r * (long long)cols + c[0]", 4, None),
])
def test_index_classes(index, vec, width):
    got = index_class(index, vec, COLS)
    assert (got.width if got else None) == width
    if got is None:
        return
    # Checked by brute force with C's integer semantics over every element of a small grid: element j of
    # each aligned vector lies at its offset in the aligned load of `width` elements.
    text = index.replace("(long long)", "").replace("LL", "").replace("cols", str(COLS))

    def at(r, c):
        return eval(text.replace("/", "//"), {}, {"r": r, "c": c})  # noqa: S307 - the test's own literals

    for r in range(300):
        for c0 in range(0, COLS, vec):
            got_at = [at(r, c0 + j) for j in range(vec)]
            base = got_at[0] - got.offsets[0]
            assert base % width == 0 and got_at == [base + d for d in got.offsets], (r, c0, got_at, got)


HOST_VECTOR_CHAIN = r"""
#include <math.h>
#include <string.h>
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
#define __align__(n) alignas(n)
DECLS
extern "C" void run(long long n, long long cols, const float* x, float* out, const void* const* t) {
PARAMS
    for (long long i0 = 0; i0 < n; i0 += VEC) {
        const long long r = i0 / cols, c0 = i0 % cols;
        float vv[VEC];
        for (int j = 0; j < VEC; ++j) vv[j] = x[i0 + j];
PRELOAD
BODY
        for (int j = 0; j < VEC; ++j) out[i0 + j] = vv[j];
    }
}
"""


def vector_chain_on_host(tmp_path, vops, vec, chain, anchor, operands):
    """The vectorized fp32 chain compiled with the host's C++ compiler and run on the CPU, a vector of
    `vec` columns at a time as the kernel runs it: each slot loaded at the vector's first column."""
    params = "\n".join(f"    const float* {chain.prefix}{i} = (const float*)t[{i}];" for i in range(len(chain.tensors)))
    text = (HOST_VECTOR_CHAIN.replace("DECLS", vops.decls).replace("VEC", str(vec)).replace("PARAMS", params)
            .replace("PRELOAD", "\n".join("        " + line for line in vops.preload.splitlines()))
            .replace("BODY", "\n".join("        " + line for line in vops.body.splitlines())))
    return run_on_host(host_library(tmp_path, text), anchor, operands)


CASES = [  # forward, inputs (torch.randn shapes), vector slots at VEC 4
    ("q * cos + torch.cat((-q[..., 8:], q[..., :8]), dim=-1) * sin", {"q": (2, 3, 5, 16), "cos": (5, 16), "sin": (5, 16)}, 3),
    ("(q + b) * torch.sigmoid(b)", {"q": (257, 96), "b": (96,)}, 1),  # per column
    ("torch.maximum(q, b) * q", {"q": (64, 33, 16), "b": (64, 33, 1)}, 0),  # per row: one element a vector
    ("q * b + 2", {"q": (100, 100), "b": (1,)}, 0),
    ("q * b - w", {"q": (6, 7, 12), "b": (6, 7, 12), "w": (7, 1)}, 1),
    ("(q + b) * 0.5 - w", {"q": (4, 16, 6, 7, 8), "b": (16, 1, 1, 1), "w": (4, 1, 1, 7, 1)}, 0),
    # GPT-J's interleaved rotary embedding: the pairs inside the vector's own load of q, cos and sin half as wide.
    ("(lambda e, o: torch.stack((e * cos - o * sin, e * sin + o * cos), dim=-1).flatten(-2))(q[..., 0::2], q[..., 1::2])",
     {"q": (2, 3, 5, 16), "cos": (5, 8), "sin": (5, 8)}, 3),
]


@pytest.mark.parametrize("expr, shapes, vectors", CASES)
def test_vectorized_chains_compute_the_forward_on_the_cpu(tmp_path, expr, shapes, vectors):
    import torch
    import torch.nn.functional as F  # noqa: F401 - the forward's namespace

    names = list(shapes)
    inputs = ", ".join(f"torch.randn{tuple(s) if len(s) > 1 else f'({s[0]},)'}" for s in shapes.values())
    p = problem_from_expr(tmp_path, expr, inputs, args=", ".join(names))
    m = match_pointwise(p)
    assert not isinstance(m, str), m
    g = torch.Generator().manual_seed(0)
    given = {f"in{k}": torch.randn(*s, generator=g) for k, s in enumerate(shapes.values())}
    # The names as globals: a lambda in the forward reads them from there.
    want = eval(expr, {"torch": torch, **{n: given[f"in{k}"] for k, n in enumerate(names)}})  # noqa: S307
    for vec in (2, 4):
        vops = operand_vectors(p, m, vec)
        assert not isinstance(vops, str), vops
        if vec == 4:
            assert vops.vectors == vectors
        if "torch.cat" in expr:  # rotate_half: each half's partner loaded only where the vector's half reads it
            assert re.search(r"if \(\(c0 < 8\)\) q\d+ = ", vops.preload) and re.search(r"if \(\(c0 >= 8\)\) q\d+ = ", vops.preload)
        got = vector_chain_on_host(tmp_path, vops, vec, m.chain, given["in0"], [given[ref] for ref, _ in m.chain.tensors])
        assert torch.allclose(got, want, atol=1e-6), (vec, (got - want).abs().max())


@pytest.mark.parametrize("name", ["float32", "bfloat16", "float16"])
def test_operand_vectors_lead_the_seeds_and_compile(tmp_path, name):
    """The models suite's rotary embedding at a small size: seeds with operands read as vectors first, the
    element-by-element kernel beside them; every VEC the dtype allows compiles with NVRTC."""
    dt = f"dtype=torch.{name}"
    p = problem_from_expr(tmp_path, CASES[0][0], f"torch.randn(2, 3, 5, 16, {dt}), torch.randn(5, 16, {dt}), "
                          f"torch.randn(5, 16, {dt})", args="q, cos, sin")
    fam = PointwiseChain()
    seeds = fam.seeds(p)
    assert seeds[0]["OPVEC"] == 1 and not seeds[1].get("OPVEC") and len(seeds) == 3
    widest = 4 if name == "float32" else 8
    configs = [dict(seeds[0], VEC=v) for v in (2, 4, 8) if v <= widest]
    assert all(fam.valid(c, p) for c in configs)
    for c in configs:
        src = fam.render(c, p).source
        assert "chain_vec(vv, i / cols, i % cols" in src and "opv_ok" in src
    smoke_compile(fam, p, 2)
    from cuforge.runtime import compile_cuda

    for c in configs:
        cand = fam.render(c, p)
        mod = compile_cuda(cand.source, arch="sm_90a", options=cand.launch.options)
        assert "pointwise" in mod.signatures and len(mod.cubin) > 0, c


def test_chains_that_cannot_be_read_as_vectors_keep_the_element_form(tmp_path):
    fam = PointwiseChain()
    # One element a row's operand and a scalar: nothing read as a vector, so no reason for the seeds to lead with it.
    p = problem_from_expr(tmp_path, "torch.maximum(a, b) * 2", "torch.randn(64, 32), torch.randn(64, 1)")
    assert fam.valid(dict(VEC=4, BLOCK=128, WAVES=0, UNROLL=1, OPVEC=1), p)
    assert operand_vectors(p, match_pointwise(p), 4).vectors == 0
    assert not any(c.get("OPVEC") for c in fam.seeds(p))
    # Rows that no vector divides, and no vector at all.
    odd = problem_from_expr(tmp_path, "a * b - 1", "torch.randn(100, 1001), torch.randn(1001)")
    assert "rows of 1001 are not whole vectors of 4" in operand_vectors(odd, match_pointwise(odd), 4)
    assert not fam.valid(dict(VEC=1, BLOCK=128, WAVES=0, UNROLL=1, OPVEC=1), odd)
    # A config stored before the knob existed renders element by element.
    src = fam.render(dict(VEC=4, BLOCK=128, WAVES=0, UNROLL=1), odd).source
    assert "chain_vec" not in src
    # A bool mask read by the chain.
    masked = problem_from_expr(tmp_path, "a.masked_fill(m, 0.0) * 2", "torch.randn(8, 64), torch.rand(8, 64) < 0.5",
                               args="a, m")
    mm = match_pointwise(masked)
    assert not isinstance(mm, str), mm
    assert operand_vectors(masked, mm, 4) == "the chain reads a mask"
