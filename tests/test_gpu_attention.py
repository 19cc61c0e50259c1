"""Attention's kernels on a real Hopper GPU against the float64 reference: scaled dot-product attention
as three kernels (batched GEMM with the scale fused, softmax_rows, batched GEMM), a matmul batched over
several leading dims as one GEMM, and the softmax that writes rows of -inf as zeros."""

import pytest

from cuforge.kernels.families import families_for
from template_helpers import CFG, assert_all_ok, family_configs, problem_from_expr, skip_unless_sm90

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("inputs", [
    "torch.rand(2, 4, 128, 64), torch.rand(2, 4, 128, 64), torch.rand(2, 4, 128, 64)",
    # ragged: rows, keys and the head dim fill no tile, values wider than queries
    "torch.randn(3, 2, 100, 72), torch.randn(3, 2, 130, 72), torch.randn(3, 2, 130, 40)",
])
def test_scaled_dot_product_attention_as_three_kernels(sup, tmp_path, inputs):
    skip_unless_sm90(sup, "the GEMMs are wgmma kernels: sm_90a")
    p = problem_from_expr(tmp_path, "F.scaled_dot_product_attention(q, k, v)", inputs, args="q, k, v")
    fam = families_for(p)[0][0]
    assert fam.name == "pipeline"
    assert_all_ok(sup, fam, p, fam.seeds(p)[:3], CFG)


def test_a_matmul_batched_over_two_dims_with_b_transposed(sup, tmp_path):
    skip_unless_sm90(sup, "the GEMMs are wgmma kernels: sm_90a")
    p = problem_from_expr(tmp_path, "torch.matmul(a, b.transpose(-1, -2)) * 0.5",
                          "torch.randn(2, 3, 200, 96), torch.randn(2, 3, 136, 96)")
    fam = families_for(p)[0][0]
    assert fam.name == "gemm_tf32x3_sm90"
    assert_all_ok(sup, fam, p, family_configs(fam, p, 1), CFG)


def test_the_safe_softmax_writes_rows_of_minus_infinity_as_zeros(sup, tmp_path):
    inputs = "torch.randn(64, 300).masked_fill(torch.arange(64).unsqueeze(1) % 5 == 0, float('-inf'))"
    p = problem_from_expr(tmp_path, "torch.ops.aten._safe_softmax(a, -1)", inputs, args="a")
    fam = families_for(p)[0][0]
    assert fam.name == "softmax_rows"
    assert_all_ok(sup, fam, p, family_configs(fam, p, 2), CFG)
