"""The fp32 GEMM / GEMV and row-norm families on a real GPU: correct against the float64 reference
across awkward shapes (M = 1, K and N not multiples of 4, transposed and batched operands, one-column
rows), with every fused epilogue kind, for both GEMM maths."""

import pytest

from cuforge.kernels.fp32 import GemmF32, Gemv
from cuforge.kernels.norms import NormRows
from template_helpers import CFG, problem_from_expr

pytestmark = pytest.mark.gpu
CUFORGE = 'CUFORGE = {"policy": "custom", "dtype": "float32"}'


def load(tmp_path, expr, inputs, args="a, b", init="        pass"):
    return problem_from_expr(tmp_path, expr, inputs, args, init, cuforge=CUFORGE, prefix="gpu")


def check(sup, fam, p, configs):
    assert fam.supports(p) is None, fam.supports(p)
    for c in configs:
        assert fam.valid(c, p), c
        ev = sup.evaluate(p, fam.render(c, p), CFG)
        assert ev.status == "ok", (p.graph, c, ev.status, ev.message)


GEMM_EXTRA = [dict(BM=64, BN=128, BK=16, WM=2, WN=2, STAGES=2, GROUP_M=1, MATH="tf32x3", PROMOTE=2),
              dict(BM=32, BN=64, BK=32, WM=1, WN=2, STAGES=5, GROUP_M=8, MATH="ffma", PROMOTE=1),
              dict(BM=256, BN=64, BK=16, WM=4, WN=2, STAGES=3, GROUP_M=8, MATH="tf32x3", PROMOTE=1)]


@pytest.mark.parametrize("expr, shapes", [
    ("a @ b", [(1, 64, 64), (100, 37, 203), (257, 1000, 130), (1024, 1024, 1024)]),
    ("a.T @ b", [(130, 64, 96), (33, 17, 50)]),
    ("a @ b.T", [(100, 37, 203), (512, 256, 384)]),
    ("torch.bmm(a, b)", [(3, 100, 70, 36), (2, 1, 9, 5)]),
])
def test_gemm_f32_is_correct_on_awkward_shapes_and_layouts(sup, tmp_path, expr, shapes):
    """3xTF32 must meet the fp32 tolerances (1e-4, relative norm 1e-5) that one TF32 pass misses."""
    g = GemmF32()
    for shape in shapes:
        if expr.startswith("torch.bmm"):
            bt, m, k, n = shape
            inputs = f"torch.randn({bt}, {m}, {k}), torch.randn({bt}, {k}, {n})"
        else:
            m, k, n = shape
            a = f"torch.randn({k}, {m})" if "a.T" in expr else f"torch.randn({m}, {k})"
            b = f"torch.randn({n}, {k})" if "b.T" in expr else f"torch.randn({k}, {n})"
            inputs = f"{a}, {b}"
        p = load(tmp_path, expr, inputs)
        big = shape[-3] * shape[-1] > 2**19
        check(sup, g, p, g.seeds(p)[: 2 if big else 3] + ([] if big else [c for c in GEMM_EXTRA if g.valid(c, p)]))


@pytest.mark.parametrize("expr, extra_input", [
    ("F.gelu(self.linear(x))", ""),
    ("self.linear(x) * 0.5 + r", ", torch.randn(M, N)"),
    ("torch.sigmoid(self.linear(x)).sum(dim=1)", ""),
    ("torch.clamp(F.leaky_relu(self.linear(x), 0.1), -0.5, 2.0) / 3.0 - r[:1]", ", torch.randn(1, N)"),
])
def test_gemm_f32_fuses_the_traced_epilogue(sup, tmp_path, expr, extra_input):
    """Bias per column, scale, residual per element, a row vector, activations, and the row sum
    (atomics into a zeroed output) on partial tiles and K not a multiple of 4."""
    g = GemmF32()
    for m, k, n in ((100, 72, 136), (1, 40, 56), (300, 37, 129)):
        init = f"        self.linear = nn.Linear({k}, {n})"
        inputs = f"torch.randn({m}, {k})" + extra_input.replace("M", str(m)).replace("N", str(n))
        p = load(tmp_path, expr, inputs, args="x, r=None" if not extra_input else "x, r", init=init)
        if "r[:1]" in expr:  # a slice is not a leaf: the family must refuse it, not compute it wrong
            assert g.supports(p) is not None
            continue
        check(sup, g, p, g.seeds(p)[:3] + [GEMM_EXTRA[0]])


def test_gemm_f32_rowvector_epilogue(sup, tmp_path):
    g = GemmF32()
    p = load(tmp_path, "torch.tanh(a @ b) * r + 1.0", "torch.randn(70, 48), torch.randn(48, 90), torch.randn(90)",
             args="a, b, r")
    check(sup, g, p, g.seeds(p)[:3])


def test_gemv_is_correct(sup, tmp_path):
    v = Gemv()
    for expr, inputs in (("a @ x", "torch.randn(1000, 4096), torch.randn(4096, 1)"),
                         ("a @ x", "torch.randn(7, 33), torch.randn(33, 1)"),
                         ("torch.relu(torch.mv(a, x) + 0.5)", "torch.randn(513, 1030), torch.randn(1030)")):
        p = load(tmp_path, expr, inputs, args="a, x")
        # and warps of 2 or 4 rows sharing their loads of x (7 and 513 rows leave a last warp short)
        check(sup, v, p, v.seeds(p) + [dict(BLOCK=128, VEC=1, UNROLL=1), dict(BLOCK=256, VEC=4, UNROLL=4, ROWS=2),
                                        dict(BLOCK=128, VEC=4, UNROLL=2, ROWS=4), dict(BLOCK=128, VEC=1, UNROLL=1, ROWS=4)])


@pytest.mark.parametrize("expr, init, args, extra", [
    ("self.norm(x)", "        self.norm = nn.LayerNorm(H)\n        nn.init.uniform_(self.norm.weight, 0.5, 1.5)\n"
     "        nn.init.uniform_(self.norm.bias, -0.5, 0.5)", "x", ""),
    ("x + F.gelu(self.norm(x))", "        self.norm = nn.LayerNorm(H, eps=1e-3)", "x", ""),
    ("F.layer_norm(x, (H,))", "        pass", "x", ""),
    ("x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-6) * self.w", "        self.w = nn.Parameter(torch.rand(H) + 0.5)", "x", ""),
    ("x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-5) * self.w * F.silu(g)",
     "        self.w = nn.Parameter(torch.rand(H) + 0.5)", "x, g", ", torch.randn(R, H)"),
])
def test_norm_rows_is_correct_on_odd_rows(sup, tmp_path, expr, init, args, extra):
    n = NormRows()
    for rows, cols in ((7, 1), (33, 1000), (64, 4099), (256, 8192)):
        inputs = f"torch.randn({rows}, {cols})" + extra.replace("R", str(rows)).replace("H", str(cols))
        p = load(tmp_path, expr.replace("(H,)", f"({cols},)"), inputs, args=args, init=init.replace("H", str(cols)))
        check(sup, n, p, n.seeds(p)[:3] + [dict(BLOCK=128, VEC=1, CACHE="smem")] + warp_per_row(n, p))


def warp_per_row(n, p):
    """The warp-per-row configs that are valid for `p` (a row a warp, 8 or 4 rows a block, the last block
    partly past the rows), unless a seed already is one."""
    configs = [dict(BLOCK=256, VEC=4, CACHE="global", ROW_WARP=1), dict(BLOCK=128, VEC=1, CACHE="global", ROW_WARP=1)]
    seeded = [c for c in n.seeds(p)[:3] if c.get("ROW_WARP")]
    return [c for c in configs if n.valid(c, p) and c not in seeded]


@pytest.mark.parametrize("torch_dtype", ["torch.bfloat16", "torch.float16"])
def test_half_precision_norm_rows_are_correct(sup, tmp_path, torch_dtype):
    # LLaMA's RMSNorm as the model writes it (x.float(), the norm, .to(x.dtype), the weight) and a layer
    # norm of a half tensor; judged against float64 at the bound PyTorch's own half result sets.
    n = NormRows()
    llama = "(lambda h: self.w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype))(x.float())"
    for rows, cols in ((7, 4), (33, 1000), (256, 4096)):
        half = f"dtype={torch_dtype}"
        cases = [(llama, f"        self.w = nn.Parameter(torch.rand({cols}, {half}) + 0.5)"),
                 ("self.norm(x)", f"        self.norm = nn.LayerNorm({cols}).to({torch_dtype})\n"
                                  "        nn.init.uniform_(self.norm.weight, 0.5, 1.5)")]
        for expr, init in cases:
            p = problem_from_expr(tmp_path, expr, f"torch.randn({rows}, {cols}, {half})", "x", init, prefix="gpu")
            check(sup, n, p, n.seeds(p)[:3] + [dict(BLOCK=128, VEC=1, CACHE="smem")] + warp_per_row(n, p))


@pytest.mark.parametrize("torch_dtype", ["torch.bfloat16", "torch.float16"])
def test_half_precision_pointwise_chains_are_correct(sup, tmp_path, torch_dtype):
    # An anchored chain with a per-column operand, an outer product of broadcast operands, and a chain
    # that rounds through a cast; odd sizes leave a tail that fills no vector.
    from cuforge.kernels.pointwise import PointwiseChain

    fam = PointwiseChain()
    half = f"dtype={torch_dtype}"
    cases = [("torch.tanh(a) * b + 0.5", f"torch.randn(33, 1001, {half}), torch.randn(1001, {half})", "a, b"),
             ("a * b", f"torch.randn(257, 1, {half}), torch.randn(1, 999, {half})", "a, b"),
             ("F.silu(a).float().to(a.dtype) * a", f"torch.randn(4099, {half})", "a")]
    for expr, inputs, args in cases:
        p = problem_from_expr(tmp_path, expr, inputs, args, prefix="gpu")
        check(sup, fam, p, fam.seeds(p)[:3] + [dict(BLOCK=128, VEC=1, WAVES=0, UNROLL=1)])
