"""conv_rows_f32 (a 2-D fp32 convolution of stride 1 as W times the input's patches, read from a ring
of input rows) on a real GPU, judged against float64: three TF32 products under the `fp32` contract, one
under `pytorch` (cuDNN's TF32, as PyTorch's default flags run it) and judged a downgrade under `fp32`;
the epilogue's bias, batch norm and residual at the flat row's channel; padding, input channels not a
multiple of 8, a 5x5 kernel, ragged tiles of channels, columns and rows."""

import pytest

from cuforge.kernels.conv_rows import ConvRowsF32
from template_helpers import (CFG, TF32_DEFAULT, assert_all_ok, assert_one_product_ok_and_a_downgrade_under_fp32,
                              assert_three_products_ok, conv_bn_residual_problem, conv_problem, family_configs)

pytestmark = pytest.mark.gpu


CONVS = [
    ("nn.Conv2d(16, 128, 3)", "(2, 16, 66, 130)", "torch.relu(y) * self.bias"),  # level1/63's kind, smaller
    ("nn.Conv2d(64, 64, 3, padding=1, bias=False)", "(2, 64, 28, 28)", "y"),      # ResNet's 3x3
    ("nn.Conv2d(3, 40, 5, padding=2)", "(2, 3, 37, 70)", "torch.tanh(y)"),        # 3 channels, ragged tiles
]


@pytest.mark.parametrize("layer, x_shape, tail", CONVS, ids=[c[0] for c in CONVS])
def test_three_products_under_fp32_and_one_under_pytorch(sup, tmp_path, layer, x_shape, tail):
    fam = ConvRowsF32()
    p = conv_problem(tmp_path, layer, x_shape, tail)
    assert_three_products_ok(sup, fam, p, family_configs(fam, p, 1)[:3], what=(layer,))
    if layer != CONVS[2][0]:  # one TF32 product where cuDNN computes in TF32 (it keeps 3 channels in fp32)
        assert_one_product_ok_and_a_downgrade_under_fp32(sup, fam, p.under("pytorch"), what=(layer,))


def test_a_batch_norm_and_a_residual_after_the_convolution(sup, tmp_path):
    # ResNet's basic block's second 3x3 in eval mode, three products and one: the batch norm's channel and
    # the residual's element at the flat row
    fam = ConvRowsF32()
    p = conv_bn_residual_problem(tmp_path, "nn.Conv2d(64, 64, 3, padding=1, bias=False)", (2, 64, 28, 28), (2, 64, 28, 28))
    for q, cfg in ((p, CFG), (p.under("pytorch"), TF32_DEFAULT)):
        assert fam.supports(q) is None, fam.supports(q)
        assert_all_ok(sup, fam, q, fam.seeds(q)[:2], cfg)
