"""fp32 1x1 convolutions as a GEMM of x as it lies (conv_pointwise_f32) on a real GPU, judged against
float64: three TF32 products under the `fp32` contract, one under `pytorch` (cuDNN's TF32, as PyTorch's
default flags run it) and judged a downgrade under `fp32`; the epilogue's per-channel bias, batch norm
and residual read at the flat row's channel; 1-D, 2-D and 3-D pixels, rows of odd lengths (4-byte copies),
a ragged last tile of channels and of pixels."""

import pytest

from cuforge.kernels.conv_pointwise import ConvPointwiseF32
from template_helpers import (CFG, TF32_DEFAULT, assert_all_ok, assert_one_product_ok_and_a_downgrade_under_fp32,
                              assert_three_products_ok, conv_bn_residual_problem, conv_problem, family_configs)

pytestmark = pytest.mark.gpu


CONVS = [
    ("nn.Conv2d(64, 128, 1)", "(4, 64, 56, 56)", "torch.relu(y) * self.bias"),  # level1/87's kind, smaller
    ("nn.Conv2d(256, 64, 1, bias=False)", "(2, 256, 28, 28)", "y"),  # ResNet's reduction
    ("nn.Conv1d(30, 50, 1)", "(3, 30, 37)", "torch.tanh(y)"),  # odd rows, a ragged tile of both
    ("nn.Conv3d(16, 24, 1)", "(2, 16, 6, 10, 12)", "y - self.bias.unsqueeze(-1)"),
]


@pytest.mark.parametrize("layer, x_shape, tail", CONVS, ids=[c[0] for c in CONVS])
def test_three_products_under_fp32(sup, tmp_path, layer, x_shape, tail):
    fam = ConvPointwiseF32()
    p = conv_problem(tmp_path, layer, x_shape, tail)
    assert_three_products_ok(sup, fam, p, family_configs(fam, p, 2), what=(layer,))


@pytest.mark.parametrize("layer, x_shape, tail", CONVS[:2], ids=[c[0] for c in CONVS[:2]])
def test_one_tf32_product_under_pytorch_and_a_downgrade_under_fp32(sup, tmp_path, layer, x_shape, tail):
    p = conv_problem(tmp_path, layer, x_shape, tail).under("pytorch")
    assert_one_product_ok_and_a_downgrade_under_fp32(sup, ConvPointwiseF32(), p, what=(layer,))


def test_a_batch_norm_and_a_residual_after_the_convolution(sup, tmp_path):
    # ResNet's expansion in eval mode: the batch norm's channel and the residual's element at the flat row
    p = conv_bn_residual_problem(tmp_path, "nn.Conv2d(64, 256, 1, bias=False)", (2, 64, 28, 28), (2, 256, 28, 28))
    fam = ConvPointwiseF32()
    assert fam.supports(p) is None, fam.supports(p)
    assert_all_ok(sup, fam, p, fam.seeds(p)[:3], CFG)
    q = p.under("pytorch")
    assert_all_ok(sup, fam, q, [c for c in fam.seeds(q) if c["MATH"] == "tf32"][:2], TF32_DEFAULT)


@pytest.mark.parametrize("tiles_per_block", [2, 4, 8])
def test_several_tiles_a_block_and_a_short_last_block(sup, tmp_path, tiles_per_block):
    fam = ConvPointwiseF32()
    base = dict(BM=64, BN=64, BK=16, WM=2, WN=2, STAGES=3, GROUP_M=1, PROMOTE=1, NT=tiles_per_block)
    # 3 x 50 = 150 pixels an image in tiles of 64: 3 tiles, so each NT leaves the last block short; 2-D
    # pixels of a ragged channel tile; three TF32 products (cuDNN keeps so few channels in fp32)
    p = conv_problem(tmp_path, "nn.Conv2d(48, 40, 1)", "(3, 48, 3, 50)", "torch.relu(y) + self.bias")
    assert_all_ok(sup, fam, p, [{**base, "MATH": "tf32x3"}], CFG, what=(tiles_per_block,))
    # one TF32 product where cuDNN runs TF32: 56 x 56 pixels, 49 tiles of 64, a short last block again
    q = conv_problem(tmp_path, *CONVS[0]).under("pytorch")
    assert_all_ok(sup, fam, q, [{**base, "MATH": "tf32"}], TF32_DEFAULT, what=(tiles_per_block,))


RESIDENT = [
    # 40 channels out of 48 in: one block row, short of BM; three products (cuDNN keeps this in fp32)
    ("nn.Conv2d(48, 40, 1)", "(3, 48, 3, 50)", "torch.relu(y) + self.bias", "fp32", 64, "tf32x3"),
    # ResNet's expansion: two block rows of W, each over its own stretch of pixels; one TF32 product
    ("nn.Conv2d(64, 256, 1)", "(2, 64, 28, 28)", "y * self.bias", "pytorch", 128, "tf32"),
    # 30 input channels: 4-byte copies, W's rows zero past K inside the resident block
    ("nn.Conv1d(30, 50, 1)", "(3, 30, 37)", "torch.tanh(y)", "fp32", 64, "tf32x3"),
]


@pytest.mark.parametrize("layer, x_shape, tail, contract, bm, maths", RESIDENT, ids=[r[0] for r in RESIDENT])
def test_w_resident_over_a_blocks_tiles(sup, tmp_path, layer, x_shape, tail, contract, bm, maths):
    fam = ConvPointwiseF32()
    p = conv_problem(tmp_path, layer, x_shape, tail).under(contract)
    configs = [dict(BM=bm, BN=64, BK=16, WM=2, WN=2, STAGES=3, GROUP_M=1, PROMOTE=1, NT=nt, A_RES=1, MATH=maths)
               for nt in (2, 4)]
    assert all(fam.valid(c, p) for c in configs), configs
    assert_all_ok(sup, fam, p, configs, TF32_DEFAULT if contract == "pytorch" else CFG, what=(layer,))
