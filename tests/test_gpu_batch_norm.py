"""Training-mode batch norm on a real GPU against the float64 reference at the harness's fp32
tolerance: 1-D, 2-D and 3-D, with and without an affine, spans that take 4-wide loads and ones that
do not, a chain after it, inputs with a large mean (the statistics' cancellation), and a GEMM head
with batch norm as the second kernel."""

import pytest

from cuforge.kernels.batch_norm import BatchNorm
from cuforge.kernels.families import families_for
from template_helpers import CFG, assert_all_ok, family_configs, problem_from_expr, skip_unless_sm90
from test_batch_norm import bn_problem

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("layer, x_shape, tail", [
    ("nn.BatchNorm2d(16)", "(4, 16, 30, 32)", "y"),
    ("nn.BatchNorm1d(24, eps=1e-3)", "(8, 24, 7)", "torch.tanh(y)"),
    ("nn.BatchNorm3d(8, affine=False)", "(2, 8, 3, 4, 5)", "y * 3"),
    ("nn.BatchNorm1d(32)", "(64, 32)", "F.gelu(y)"),
    ("nn.BatchNorm2d(64)", "(32, 64, 64, 64)", "y"),
])
def test_batch_norm(sup, tmp_path, layer, x_shape, tail):
    fam = BatchNorm()
    p = bn_problem(tmp_path, layer, x_shape, tail)
    assert_all_ok(sup, fam, p, family_configs(fam, p, 1), CFG)


def test_statistics_of_inputs_far_from_zero(sup, tmp_path):
    fam = BatchNorm()  # mean 100, std 0.5: E[x^2] - E[x]^2 loses 5 of a double's 16 digits (all of a float's 7)
    p = problem_from_expr(tmp_path, "self.bn(a)", "torch.randn(16, 8, 40, 40) * 0.5 + 100.0", args="a",
                          init="        self.bn = nn.BatchNorm2d(8)")
    assert_all_ok(sup, fam, p, fam.seeds(p)[:1], CFG)


def test_gemm_then_batch_norm(sup, tmp_path):
    skip_unless_sm90(sup, "the GEMM stage is the sm_90a 3xTF32 kernel")
    init = "        self.fc = nn.Linear(256, 384)\n        self.bn = nn.BatchNorm1d(384)"
    p = problem_from_expr(tmp_path, "torch.relu(self.bn(self.fc(a) * 2))", "torch.randn(512, 256)", args="a", init=init)
    fam = families_for(p)[0][0]
    assert_all_ok(sup, fam, p, fam.seeds(p)[:2], CFG)
