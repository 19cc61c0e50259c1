"""A convolution whose forward ends in a global pooling, summed in the implicit GEMM's epilogue (and the
persistent grid, a block per SM walking the tiles), on a real Hopper GPU against the float64 reference:
a mean after GELU of folded few-channel taps (KernelBench level2/67's shape, smaller), a keepdim sum
with a bias and a constant after it over a ragged channel tile, a transposed convolution's phases, 3-D
and 1-D, many tiles of one image adding into one output, and a pooled head before more kernels."""

import pytest

from cuforge.kernels.conv import ConvTf32x3Sm90
from cuforge.kernels.families import families_for
from template_helpers import CFG, conv_problem, family_configs, skip_unless_sm90

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("layer, x_shape, tail, n_random", [
    ("nn.Conv2d(8, 64, 3)", "(4, 8, 40, 41)", "F.adaptive_avg_pool2d(F.gelu(y), 1).squeeze(-1).squeeze(-1)", 2),
    ("nn.Conv2d(32, 48, 3, padding=1)", "(3, 32, 30, 31)", "torch.sum(torch.relu(y + self.bias), dim=(2, 3), keepdim=True) * 2", 1),
    ("nn.ConvTranspose2d(16, 32, 3, stride=2, padding=1, output_padding=1)", "(2, 16, 17, 18)",
     "torch.mean(y * 0.5, dim=[2, 3], keepdim=True)", 1),
    ("nn.Conv3d(16, 32, 3)", "(2, 16, 8, 9, 10)", "torch.tanh(y).mean(dim=(-1, -2, -3))", 1),
    ("nn.Conv1d(16, 32, 3)", "(3, 16, 700)", "y.sum(-1)", 1),
    ("nn.Conv2d(8, 16, 3)", "(2, 8, 130, 131)", "torch.mean(torch.sigmoid(y), dim=(2, 3))", 1),  # 129 tiles an image
    ("nn.Conv2d(32, 200, 3)", "(2, 32, 20, 21)", "torch.mean(y, dim=(2, 3))", 0),  # tiles of 192 channels, then 8
])
def test_a_pooled_convolution_and_its_persistent_grid(sup, tmp_path, layer, x_shape, tail, n_random):
    skip_unless_sm90(sup, "wgmma needs sm_90a")
    fam = ConvTf32x3Sm90()
    p = conv_problem(tmp_path, layer, x_shape, tail)
    assert fam.supports(p) is None and fam.matched(p).pool, fam.supports(p)
    configs = family_configs(fam, p, n_random)
    if fam.matched(p).c_out > 128:  # every consumer thread flushes a channel's sum
        configs.insert(0, {"BN": 192, "TW": 32, "TH": 4, "GROUP_M": 8, "FOLD": 0, "STAGES": 2})
    configs += [{**c, "PERSIST": 1} for c in configs[:2] if c.get("PERSIST") != 1]
    for c in configs:
        ev = sup.evaluate(p, fam.render(c, p), CFG)
        assert ev.status == "ok", (layer, tail, c, ev.status, ev.message)


def test_a_pooled_head_before_more_kernels(sup, tmp_path):
    skip_unless_sm90(sup, "wgmma needs sm_90a")
    p = conv_problem(tmp_path, "nn.ConvTranspose2d(16, 32, 3)", "(4, 16, 30, 31)",
                     "torch.logsumexp(torch.mean(y, dim=(2, 3), keepdim=True) + self.bias, dim=1, keepdim=True) * 10")
    fam = families_for(p)[0][0]
    for c in fam.seeds(p)[:2]:
        ev = sup.evaluate(p, fam.render(c, p), CFG)
        assert ev.status == "ok", (fam.name, c, ev.status, ev.message)
