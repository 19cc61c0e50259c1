"""GEMMs written through views (einsum) on a real Hopper GPU: the 3xTF32 kernel on operands resolved
through views, against the float64 reference at the harness's fp32 tolerance - merged leading dims
(KernelBench's level1/11 pattern), A transposed, B transposed with merged rows."""

import pytest

from cuforge.kernels.gemm_tf32 import GemmTf32x3Sm90
from template_helpers import CFG, assert_all_ok, problem_from_expr, skip_unless_sm90

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("expr, inputs", [
    ('torch.einsum("bijl,lk->bijk", a, b)', "torch.randn(2, 16, 32, 64), torch.randn(64, 96)"),
    ('torch.einsum("ki,kj->ij", a, b)', "torch.randn(200, 136), torch.randn(200, 72)"),
    ('torch.einsum("bik,jk->bij", a, b)', "torch.randn(3, 100, 256), torch.randn(120, 256)"),
])
def test_gemm_through_views(sup, tmp_path, expr, inputs):
    fam = GemmTf32x3Sm90()
    skip_unless_sm90(sup, "wgmma needs sm_90a")
    p = problem_from_expr(tmp_path, expr, inputs)
    assert fam.supports(p) is None, fam.supports(p)
    assert_all_ok(sup, fam, p, fam.seeds(p)[:2], CFG)
