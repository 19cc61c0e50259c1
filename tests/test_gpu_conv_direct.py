"""The direct grouped / depthwise convolution on a real GPU against the float64 reference at the
harness's fp32 tolerance: depthwise with and without a channel multiplier, 1-D, 2-D and 3-D grouped,
stride, padding, dilation, transposed grouped (taps the stride skips), a fused per-channel chain,
several pixels and output channels per thread; and the depthwise-separable pair as two kernels."""

import pytest

from cuforge.kernels.conv_direct import ConvDirect
from cuforge.kernels.families import families_for
from cuforge.sandbox.evaluation import EvalConfig
from template_helpers import assert_all_ok, conv_problem, family_configs, problem_from_expr, skip_unless_sm90
from test_conv_direct import SHAPES

pytestmark = pytest.mark.gpu
CFG = EvalConfig(baselines=("torch",), max_timing_s=0.3, min_samples=5, profile=False)


@pytest.mark.parametrize("layer, x_shape", SHAPES + [("nn.Conv2d(64, 64, 3, groups=64, bias=False)", "(4, 64, 67, 130)")])
def test_direct_convolution(sup, tmp_path, layer, x_shape):
    fam = ConvDirect()
    tail = "torch.relu(y) - self.bias" if "2d(" in layer else "torch.relu(y) * 2"  # self.bias is (C, 1, 1)
    p = conv_problem(tmp_path, layer, x_shape, tail)
    assert_all_ok(sup, fam, p, family_configs(fam, p, 2), CFG)


def test_depthwise_then_pointwise(sup, tmp_path):
    skip_unless_sm90(sup, "the pointwise stage is the sm_90a implicit GEMM")
    init = "        self.dw = nn.Conv2d(32, 32, 3, padding=1, groups=32)\n        self.pw = nn.Conv2d(32, 64, 1)"
    p = problem_from_expr(tmp_path, "self.pw(self.dw(a))", "torch.randn(2, 32, 40, 41)", args="a", init=init)
    fam = families_for(p)[0][0]
    assert_all_ok(sup, fam, p, fam.seeds(p)[:2], CFG)
