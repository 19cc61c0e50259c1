"""The skinny GEMM family on a real GPU, judged against float64 at the bound PyTorch's own result in
that dtype sets: 1-16 rows through a weight stored [N, K] in fp32, bf16 and fp16; K not a multiple of
the 16-byte load (a scalar tail), N not a multiple of a block's columns (idle warps at the barrier),
leading dims merged into the rows, a bias and activations fused; every seed and the other knob
values. A half-precision matrix-vector product A @ v with an activation, v as the one row. The
tensor-core family in bf16 and fp16: one tile of 8 rows and two, ragged N and K (chunks of 32 k cut
short), every seed and every knob value."""

import pytest

from cuforge.kernels.gemm_skinny import GemmSkinny, GemmSkinnyTC
from template_helpers import assert_all_ok, check_family, problem_from_expr
from test_gemm_skinny import linear

pytestmark = pytest.mark.gpu
EXTRA = [dict(BLOCK=128, COLS=4, UNROLL=2, KSPLIT=4), dict(BLOCK=256, COLS=2, UNROLL=1, KSPLIT=4),
         dict(BLOCK=128, COLS=1, UNROLL=1, KSPLIT=1)]


@pytest.mark.parametrize("dtype", ["torch.float32", "torch.bfloat16", "torch.float16"])
def test_skinny_gemm_is_correct(sup, tmp_path, dtype):
    fam = GemmSkinny()
    cases = [(1, 4096, 11008, "self.linear(x)", "", False), (8, 1003, 200, "F.gelu(self.linear(x))", "", True),
             (16, 2048, 96, "F.silu(self.linear(x)) * 2.0", "", True), (3, 64, 40, "self.linear(x)", "2, ", True),
             (1, 9, 5, "torch.relu(self.linear(x))", "", True)]
    for rows, k, n, expr, lead, bias in cases:
        p = linear(tmp_path, rows, k, n, dtype, expr, bias=bias, lead=lead)
        assert fam.supports(p) is None, fam.supports(p)
        configs = fam.seeds(p) + [c for c in EXTRA if fam.valid(c, p) and c not in fam.seeds(p)]
        assert_all_ok(sup, fam, p, configs, what=(rows, k, n, expr, dtype))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_matrix_vector_product_as_one_row(sup, tmp_path, dtype):
    fam = GemmSkinny()
    for m, k, expr in ((2048, 65536, "torch.matmul(a, b)"), (1000, 1003, "torch.relu(a @ b) * 2")):
        p = problem_from_expr(tmp_path, expr, f"torch.rand({m}, {k}, dtype=torch.{dtype}), torch.rand({k}, 1, dtype=torch.{dtype})",
                              prefix="gpu")
        check_family(sup, fam, p, n_random=0)


@pytest.mark.parametrize("dtype", ["torch.bfloat16", "torch.float16"])
def test_tensor_core_skinny_gemm_is_correct(sup, tmp_path, dtype):
    fam = GemmSkinnyTC()
    every_knob = [dict(WT=2, UNROLL=2, KSPLIT=4, OCC=32), dict(WT=1, UNROLL=1, KSPLIT=4, OCC=24),
                  dict(WT=2, UNROLL=1, KSPLIT=8, OCC=0)]
    # Every seed and knob value on the shapes with tails (ragged N and K, two tiles of X rows, merged
    # leading dims); the first seed on the others.
    cases = [(8, 4096, 4096, "self.linear(x)", "", False, False), (16, 1000, 90, "F.gelu(self.linear(x))", "", True, True),
             (12, 2056, 200, "F.silu(self.linear(x)) * 2.0", "", True, True), (3, 64, 40, "self.linear(x)", "2, ", True, False),
             (1, 72, 17, "torch.relu(self.linear(x))", "", True, False)]
    for rows, k, n, expr, lead, bias, every in cases:
        p = linear(tmp_path, rows, k, n, dtype, expr, bias=bias, lead=lead)
        assert fam.supports(p) is None, fam.supports(p)
        configs = fam.seeds(p) + [c for c in every_knob if fam.valid(c, p) and c not in fam.seeds(p)] if every else fam.seeds(p)[:1]
        assert_all_ok(sup, fam, p, configs, what=(rows, k, n, expr, dtype))
