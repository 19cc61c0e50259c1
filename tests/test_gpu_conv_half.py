"""The fp16/bf16 implicit-GEMM convolution (conv_half_sm90) on a real GPU, judged against float64 at
the bound PyTorch's own result in that dtype sets: 1-D, 2-D and 3-D, strided and dilated, 1x1,
transposed, channels that are no whole 16 bytes, few channels folded into the channel vector, flat
padded planes, the persistent grid, and the traced bias and activations fused; each case's seeds and
two random valid configs."""

import pytest

from cuforge.kernels.conv_half import ConvHalfSm90
from template_helpers import assert_all_ok, family_configs, problem_from_expr

pytestmark = pytest.mark.gpu

CONVS = [("nn.Conv2d(64, 128, 3, padding=1)", "2, 64, 30, 31", "torch.relu(y + self.bias)"),
         ("nn.Conv2d(32, 64, 3, stride=2, padding=2, dilation=2)", "2, 32, 33, 35", "y"),
         ("nn.Conv2d(256, 192, 1, bias=False)", "4, 256, 14, 14", "F.gelu(y)"),
         ("nn.Conv2d(20, 40, (3, 5), padding=(1, 2))", "3, 20, 17, 19", "torch.sigmoid(y) * y"),
         ("nn.Conv2d(3, 64, 7, stride=2, padding=3)", "2, 3, 64, 64", "torch.relu(y)"),
         ("nn.Conv3d(16, 32, 3, padding=1)", "2, 16, 8, 9, 10", "y * 2"),
         ("nn.Conv1d(32, 64, 5, padding=2)", "4, 32, 300", "torch.tanh(y)"),
         ("nn.ConvTranspose2d(32, 16, 3, stride=2, padding=1, output_padding=1)", "2, 32, 17, 18", "y"),
         ("nn.ConvTranspose3d(16, 16, 3, stride=2, padding=1)", "1, 16, 5, 6, 7", "torch.relu(y)")]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("layer,shape,tail", CONVS, ids=[c[0] for c in CONVS])
def test_half_implicit_gemm_convolution(sup, tmp_path, dtype, layer, shape, tail):
    fam = ConvHalfSm90()
    out_channels = layer.split("(")[1].split(",")[1].strip()
    p = problem_from_expr(tmp_path, f"(lambda y: {tail})(self.conv(a))", f"torch.randn({shape}, dtype=torch.{dtype})", "a",
                          f"        self.conv = {layer[:-1]}, dtype=torch.{dtype})\n"
                          f"        self.bias = nn.Parameter(torch.randn({out_channels}, 1, 1, dtype=torch.{dtype}))",
                          prefix="gpu")
    assert fam.supports(p) is None, fam.supports(p)
    configs = family_configs(fam, p, 2)
    assert_all_ok(sup, fam, p, configs[:4] + configs[len(fam.seeds(p)):], what=(layer, dtype))  # the first seeds, the random ones


# 1x1 convolutions that read x as it lies (NCHW): fewer channels than a k-tile and a ragged last tile
# (MobileNetV2's expansion), four k-tiles with a bias, each with and without the epilogue by runs.
NCHW_CONVS = [("nn.Conv2d(24, 144, 1, bias=False)", "2, 24, 28, 28", "torch.clamp(y, 0, 6)"),
              ("nn.Conv2d(256, 64, 1)", "2, 256, 16, 20", "torch.relu(y)")]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("layer,shape,tail", NCHW_CONVS, ids=[c[0] for c in NCHW_CONVS])
def test_a_1x1_convolution_reading_x_as_it_lies(sup, tmp_path, dtype, layer, shape, tail):
    fam = ConvHalfSm90()
    p = problem_from_expr(tmp_path, f"(lambda y: {tail})(self.conv(a))", f"torch.randn({shape}, dtype=torch.{dtype})", "a",
                          f"        self.conv = {layer[:-1]}, dtype=torch.{dtype})", prefix="gpu")
    nchw = fam.seeds(p)[0]
    assert nchw.get("NCHW") == 1, fam.seeds(p)
    configs = [nchw, {**nchw, "EPI_RUNS": 1 - nchw.get("EPI_RUNS", 0)}, {**nchw, "BN": 64, "PERSIST": 1, "EPI_RUNS": 0}]
    assert all(fam.valid(c, p) for c in configs), configs
    assert_all_ok(sup, fam, p, configs, what=(layer, dtype))
