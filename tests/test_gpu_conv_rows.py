"""conv_rows_f32 (a 2-D fp32 convolution of stride 1 as W times the input's patches, read from a ring
of input rows) on a real GPU, judged against float64: three TF32 products under the `fp32` contract, one
under `pytorch` (cuDNN's TF32, as PyTorch's default flags run it) and judged a downgrade under `fp32`;
the epilogue's bias, batch norm and residual at the flat row's channel; padding, input channels not a
multiple of 8, a 5x5 kernel, ragged tiles of channels, columns and rows."""

import pytest

from cuforge.kernels.conv_rows import ConvRowsF32
from cuforge.sandbox.protocol.evaluation import EvalConfig
from template_helpers import CFG, assert_all_ok, conv_problem, family_configs, problem_from_expr

pytestmark = pytest.mark.gpu

DEFAULT = EvalConfig(baselines=("torch",), max_timing_s=0.3, min_samples=5, profile=False, precision="pytorch")
STRICT = EvalConfig(baselines=("torch",), max_timing_s=0.3, min_samples=5, profile=False, precision="fp32")

CONVS = [
    ("nn.Conv2d(16, 128, 3)", "(2, 16, 66, 130)", "torch.relu(y) * self.bias"),  # level1/63's kind, smaller
    ("nn.Conv2d(64, 64, 3, padding=1, bias=False)", "(2, 64, 28, 28)", "y"),      # ResNet's 3x3
    ("nn.Conv2d(3, 40, 5, padding=2)", "(2, 3, 37, 70)", "torch.tanh(y)"),        # 3 channels, ragged tiles
]


@pytest.mark.parametrize("layer, x_shape, tail", CONVS, ids=[c[0] for c in CONVS])
def test_three_products_under_fp32(sup, tmp_path, layer, x_shape, tail):
    fam = ConvRowsF32()
    p = conv_problem(tmp_path, layer, x_shape, tail)
    assert fam.supports(p) is None, fam.supports(p)
    configs = family_configs(fam, p, 1)
    assert {c["MATH"] for c in configs} == {"tf32x3"}
    assert_all_ok(sup, fam, p, configs[:3], CFG, what=(layer,))


@pytest.mark.parametrize("layer, x_shape, tail", CONVS[:2], ids=[c[0] for c in CONVS[:2]])
def test_one_tf32_product_under_pytorch_and_a_downgrade_under_fp32(sup, tmp_path, layer, x_shape, tail):
    fam = ConvRowsF32()
    p = conv_problem(tmp_path, layer, x_shape, tail).under("pytorch")
    ones = [c for c in fam.seeds(p) if c["MATH"] == "tf32"]
    assert ones
    assert_all_ok(sup, fam, p, ones[:3], DEFAULT, what=(layer,))
    strict = sup.evaluate(p, fam.render(ones[0], p), STRICT)
    assert strict.status in ("cheat:precision_downgrade", "wrong_output"), (layer, strict.status, strict.message)


def test_a_batch_norm_and_a_residual_after_the_convolution(sup, tmp_path):
    # ResNet's basic block's second 3x3 in eval mode: the batch norm's channel and the residual's
    # element at the flat row
    p = problem_from_expr(tmp_path, "torch.relu(self.bn(self.conv(a)) + r)",
                          "torch.randn(2, 64, 28, 28), torch.randn(2, 64, 28, 28)", "a, r",
                          "        self.conv = nn.Conv2d(64, 64, 3, padding=1, bias=False)\n        self.bn = nn.BatchNorm2d(64)\n"
                          "        self.bn.running_mean.uniform_(-1, 1)\n        self.bn.running_var.uniform_(0.5, 2)\n"
                          "        self.eval()", prefix="gpu")
    fam = ConvRowsF32()
    assert fam.supports(p) is None, fam.supports(p)
    assert_all_ok(sup, fam, p, fam.seeds(p)[:2], CFG)
