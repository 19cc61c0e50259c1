"""Convolutions whose fused epilogue reads a tensor per output value, on a real GPU: batch norm, a residual
add and a ReLU after the convolution, as ResNet's and MobileNetV2's blocks run them, judged against float64
in fp32 (3xTF32), bf16 and fp16, over flat padded planes and tiles of rows, the persistent grid with a
tile's epilogue beside the next tile's products, a channel tile past C_out's end and pixel tiles past the
image's (runs of 8 pixels that cross a row's end or the image's), and a transposed convolution (runs whose
pixels lie S apart); each layout with its epilogue in fragment order and by runs through shared memory
(EPI_RUNS), x laid out 16 bytes a thread access (XVEC) for the flat planes and the persistent grid's, and
x read as it lies by the half 1x1 convolution (NCHW)."""

import pytest

from cuforge.kernels.conv import ConvTf32x3Sm90
from cuforge.kernels.conv_half import ConvHalfSm90
from template_helpers import assert_all_ok, problem_from_expr

pytestmark = pytest.mark.gpu

# (conv layer, x shape, residual shape): 1x1 up as in a bottleneck, a 3x3 of 24 output channels (a
# 32-wide channel tile ends past them) on an odd-sized image, a 3x3 stride-2 (tiles of rows only), a
# transposed one of stride 2 (a tile's pixels are every other output along W).
BLOCKS = [("nn.Conv2d(64, 256, 1, bias=False)", "2, 64, 20, 20", "2, 256, 20, 20"),
          ("nn.Conv2d(144, 24, 3, padding=1, bias=False)", "2, 144, 19, 23", "2, 24, 19, 23"),
          ("nn.Conv2d(32, 64, 3, stride=2, padding=1, bias=False)", "3, 32, 29, 30", "3, 64, 15, 15"),
          ("nn.ConvTranspose2d(48, 32, 3, stride=2, padding=1, output_padding=1, bias=False)", "2, 48, 9, 11", "2, 32, 18, 22")]

LAYOUTS = [{"FLAT": 1, "TW": 128, "TH": 1}, {"FLAT": 1, "TW": 128, "TH": 1, "XVEC": 1}, {"TW": 32, "TH": 4},
           {"TW": 16, "TH": 8, "PERSIST": 1, "OVERLAP": 1, "XVEC": 1}, {"FLAT": 1, "TW": 128, "TH": 1, "NCHW": 1}]


def block_problem(tmp_path, layer, x_shape, res_shape, dtype):
    out_channels = layer.split("(")[1].split(",")[1].strip()
    return problem_from_expr(
        tmp_path, "torch.relu(self.bn(self.conv(a)) + b)",
        f"torch.randn({x_shape}, dtype=torch.{dtype}), torch.randn({res_shape}, dtype=torch.{dtype})", "a, b",
        f"        self.conv = {layer[:-1]}, dtype=torch.{dtype})\n"
        f"        self.bn = nn.BatchNorm2d({out_channels}, dtype=torch.{dtype})\n"
        "        with torch.no_grad():\n"
        "            self.bn.running_mean.uniform_(-0.5, 0.5)\n"
        "            self.bn.running_var.uniform_(0.5, 1.5)\n"
        "        self.eval()", prefix="gpu")


def layout_configs(fam, p):
    """The first seed in each of LAYOUTS that is valid here, with and without EPI_RUNS, at the most stages
    (up to 4) that fit."""
    seed = fam.seeds(p)[0]
    base = {k: v for k, v in seed.items() if k in ("BN", "GROUP_M", "PASSES")}
    out = []
    for layout in LAYOUTS:
        for runs in (0, 1):
            c = {**base, "FOLD": 0, **layout, "EPI_RUNS": runs}
            fits = [s for s in (4, 3, 2) if fam.valid({**c, "STAGES": s}, p)]
            if fits:
                out.append({**c, "STAGES": fits[0]})
    return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("layer,x_shape,res_shape", BLOCKS, ids=[b[0] for b in BLOCKS])
def test_a_residual_block_fused_after_the_convolution(sup, tmp_path, dtype, layer, x_shape, res_shape):
    p = block_problem(tmp_path, layer, x_shape, res_shape, dtype)
    fam = ConvTf32x3Sm90() if dtype == "float32" else ConvHalfSm90()
    assert fam.supports(p) is None, fam.supports(p)
    configs = layout_configs(fam, p)
    assert any(c.get("OVERLAP") and c["EPI_RUNS"] for c in configs), configs
    assert_all_ok(sup, fam, p, configs, what=(layer, dtype))
