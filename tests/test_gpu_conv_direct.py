"""The direct grouped / depthwise convolution on a real GPU against the float64 reference at the
harness's fp32 tolerance: depthwise with and without a channel multiplier, 1-D, 2-D and 3-D grouped,
stride, padding, dilation, transposed grouped (taps the stride skips), a fused per-channel chain,
several pixels and output channels per thread, the weights kept in shared memory and each input row slid
over in registers (WIN: strided, padded, dilated, a ragged last pixel group); and the depthwise-separable
pair as two kernels."""

import pytest

from cuforge.kernels.conv_direct import ConvDirect
from cuforge.kernels.families import families_for
from template_helpers import CFG, assert_all_ok, conv_problem, family_configs, problem_from_expr, skip_unless_sm90
from test_conv_direct import SHAPES

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("layer, x_shape", SHAPES + [("nn.Conv2d(64, 64, 3, groups=64, bias=False)", "(4, 64, 67, 130)")])
def test_direct_convolution(sup, tmp_path, layer, x_shape):
    fam = ConvDirect()
    tail = "torch.relu(y) - self.bias" if "2d(" in layer else "torch.relu(y) * 2"  # self.bias is (C, 1, 1)
    p = conv_problem(tmp_path, layer, x_shape, tail)
    assert_all_ok(sup, fam, p, family_configs(fam, p, 2), CFG)


WINDOWED = [s for s in SHAPES if "Transpose" not in s[0]] + [
    ("nn.Conv2d(3, 16, 11, stride=4, padding=2)", "(2, 3, 63, 61)"),  # level1/50's layer, smaller
    ("nn.Conv3d(3, 16, (3, 3, 1))", "(2, 3, 12, 13, 10)"),            # level1/59's: W of 10, one tap along it
    ("nn.Conv1d(4, 8, 7, padding=3, dilation=3)", "(2, 4, 101)"),
]


@pytest.mark.parametrize("layer, x_shape", WINDOWED)
def test_direct_convolution_with_weights_shared_and_rows_slid(sup, tmp_path, layer, x_shape):
    fam = ConvDirect()
    p = conv_problem(tmp_path, layer, x_shape, "torch.tanh(y) * 2")
    shapes = ((256, 8, 4), (128, 4, 2), (256, 16, 1), (512, 2, 4), (128, 1, 4), (256, 1, 2), (256, 4, 1))
    seeds = [c for c in fam.seeds(p) if c.get("WIN")]
    configs = seeds + [c for b, o, pw in shapes if fam.valid(c := dict(BLOCK=b, OCT=o, PW=pw, WIN=1), p) and c not in seeds]
    # two shared-weight seeds, and the 16-byte one (VW) first where W is neither strided nor dilated
    assert len([c for c in seeds if not c.get("VW")]) == 2 and len(configs) >= 3, configs
    f = fam.matched(p)
    assert seeds[0].get("VW", 0) == int(f.stride[-1] == 1 and f.dilation[-1] == 1), seeds
    assert_all_ok(sup, fam, p, configs, CFG)


def test_depthwise_then_pointwise(sup, tmp_path):
    skip_unless_sm90(sup, "the pointwise stage is the sm_90a implicit GEMM")
    init = "        self.dw = nn.Conv2d(32, 32, 3, padding=1, groups=32)\n        self.pw = nn.Conv2d(32, 64, 1)"
    p = problem_from_expr(tmp_path, "self.pw(self.dw(a))", "torch.randn(2, 32, 40, 41)", args="a", init=init)
    fam = families_for(p)[0][0]
    assert_all_ok(sup, fam, p, fam.seeds(p)[:2], CFG)


VECTORED = [("nn.Conv2d(144, 144, 3, padding=1, groups=144, bias=False)", "4, 144, 56, 56"),  # MobileNetV2's depthwise
            ("nn.Conv2d(32, 32, 7, padding=3, groups=32, bias=False)", "2, 32, 29, 31"),     # ConvNeXt's, rows not aligned
            ("nn.Conv2d(16, 32, 3, padding=1, groups=4, bias=False)", "2, 16, 20, 24")]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("layer, x_shape", VECTORED)
def test_rows_and_outputs_moved_16_bytes_at_a_time(sup, tmp_path, layer, x_shape, dtype):
    """VW: 8 pixels a thread, a row's inputs under them and their outputs as 16-byte loads and stores
    where aligned (element by element where not), with batch norm and ReLU6 fused after it."""
    fam = ConvDirect()
    channels = layer.split("(")[1].split(",")[1].strip()
    p = problem_from_expr(tmp_path, "torch.clamp(self.bn(self.conv(a)), 0, 6)", f"torch.randn({x_shape}, dtype=torch.{dtype})", "a",
                          f"        self.conv = {layer[:-1]}, dtype=torch.{dtype})\n"
                          f"        self.bn = nn.BatchNorm2d({channels}, dtype=torch.{dtype})\n"
                          "        with torch.no_grad():\n            self.bn.running_var.uniform_(0.5, 1.5)\n        self.eval()", prefix="gpu")
    assert fam.supports(p) is None, fam.supports(p)
    configs = [c for o in (1, 2, 8) for vw in (0, 1) if fam.valid(c := dict(BLOCK=256, OCT=o, PW=8, WIN=1, VW=vw), p)]
    assert any(c["VW"] for c in configs), configs
    assert_all_ok(sup, fam, p, configs, what=(layer, dtype))
