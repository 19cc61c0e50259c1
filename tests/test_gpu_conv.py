"""The implicit-GEMM convolution on a real Hopper GPU against the float64 reference at the harness's
fp32 tolerance: 1-D, 2-D and 3-D; ragged output tiles and channel tiles; few input channels (padded
to TMA's 16-byte rows); stride, padding, dilation and rectangular kernels; no bias; a fused chain with
a per-channel parameter; few channels with the inner taps folded into the channel vector; transposed
convolutions by output phase, including phases no tap reaches; the input read as it lies (DIRECT), its
boxes starting on a 16-byte boundary before each window, also on persistent grids with OVERLAP; strided W read
densely; transposed tiles spanning every phase along W (DENSE_W); flat tiles over zero-padded planes (FLAT)."""

import pytest

from cuforge.kernels.conv import ConvTf32x3Sm90
from cuforge.sandbox.protocol.evaluation import EvalConfig
from template_helpers import CFG, assert_all_ok, conv_problem, family_configs, skip_unless_sm90

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("layer, x_shape, tail, n_random", [
    ("nn.Conv2d(64, 128, 3)", "(2, 64, 34, 35)", "torch.relu(y) + self.bias", 2),
    ("nn.Conv2d(37, 50, 3, padding=1, bias=False)", "(3, 37, 20, 21)", "y * 2", 1),
    ("nn.Conv2d(3, 16, (3, 5), stride=(2, 1), padding=(1, 2), dilation=(2, 1))", "(4, 3, 40, 41)", "torch.tanh(y)", 1),
    ("nn.Conv2d(8, 64, 3, stride=2)", "(5, 8, 33, 64)", "y", 1),
    ("nn.Conv2d(8, 16, 3)", "(2, 8, 18, 18)", "y + self.bias.view(1, 1, 1, 16)", 1),  # an operand per image column
    ("nn.Conv1d(5, 24, 7, stride=3, padding=2)", "(3, 5, 500)", "y", 1),
    ("nn.Conv1d(40, 16, 3, stride=5, dilation=2)", "(2, 40, 2000)", "y", 0),  # four boxes of 32 a tile
    ("nn.Conv3d(9, 32, 3, padding=1)", "(2, 9, 9, 10, 11)", "torch.sigmoid(y) * self.bias.unsqueeze(-1)", 1),
    ("nn.Conv2d(256, 192, 1)", "(2, 256, 17, 17)", "y", 0),
    ("nn.ConvTranspose2d(64, 48, 3)", "(2, 64, 30, 31)", "y", 1),
    ("nn.ConvTranspose2d(32, 64, 3, stride=2, padding=1, output_padding=1)", "(3, 32, 17, 16)", "torch.tanh(y) - self.bias", 1),
    ("nn.ConvTranspose2d(16, 24, (4, 3), stride=(2, 3), padding=(1, 0), dilation=(1, 2))", "(2, 16, 9, 12)", "y", 1),
    ("nn.ConvTranspose1d(6, 10, 1, stride=2)", "(2, 6, 50)", "y", 0),  # odd outputs: no tap reaches them (the bias)
    ("nn.ConvTranspose3d(8, 16, 3, stride=2, padding=1, output_padding=1)", "(2, 8, 6, 7, 8)", "y * 2", 1),
])
def test_implicit_gemm_convolution(sup, tmp_path, layer, x_shape, tail, n_random):
    fam = ConvTf32x3Sm90()
    skip_unless_sm90(sup, "wgmma needs sm_90a")
    p = conv_problem(tmp_path, layer, x_shape, tail)
    assert fam.supports(p) is None, fam.supports(p)
    for c in family_configs(fam, p, n_random):
        ev = sup.evaluate(p, fam.render(c, p), CFG)
        assert ev.status == "ok", (layer, c, ev.status, ev.message)


@pytest.mark.parametrize("layer, x_shape, tail", [
    ("nn.Conv2d(64, 128, 3)", "(2, 64, 34, 36)", "torch.relu(y) + self.bias"),
    ("nn.Conv2d(37, 50, 3, padding=1, bias=False)", "(3, 37, 20, 24)", "y * 2"),  # a channel tail past 32
    ("nn.Conv2d(20, 16, (3, 5), stride=(2, 1), padding=(1, 2), dilation=(2, 1))", "(4, 20, 40, 44)", "torch.tanh(y)"),
    ("nn.Conv1d(40, 16, 5, padding=2, dilation=3)", "(2, 40, 2000)", "y"),  # boxes of a 1-D tile, each tap's own start
    # W strided: dense rows from the boundary, every S-th float taken (an element stride along W hung the H100)
    ("nn.Conv1d(40, 16, 3, stride=5, dilation=2)", "(2, 40, 2000)", "y"),
    ("nn.Conv1d(64, 128, 3, stride=3, dilation=4)", "(2, 64, 6000)", "y * 2"),  # level1/76's conv, shorter
    ("nn.Conv1d(40, 24, 5, stride=3, padding=2)", "(3, 40, 1000)", "y"),  # windows starting before the input
    ("nn.Conv2d(32, 64, 3, stride=2, padding=1)", "(2, 32, 33, 68)", "torch.relu(y)"),
    ("nn.Conv2d(32, 64, (1, 3))", "(2, 32, 16, 64)", "y"),  # W taps: windows 1 and 2 floats past a 16-byte boundary
    ("nn.Conv3d(9, 32, 3, padding=1)", "(2, 9, 9, 10, 12)", "torch.sigmoid(y) * self.bias.unsqueeze(-1)"),
    ("nn.Conv2d(256, 192, 1)", "(2, 256, 17, 20)", "y"),
    ("nn.ConvTranspose2d(32, 64, 3, stride=2, padding=1, output_padding=1)", "(3, 32, 17, 16)", "torch.tanh(y) - self.bias"),
    ("nn.ConvTranspose3d(8, 16, 3, stride=2, padding=1, output_padding=1)", "(2, 8, 6, 7, 8)", "y * 2"),
])
def test_the_input_read_as_it_lies(sup, tmp_path, layer, x_shape, tail):
    # DIRECT: no channels-last planes; TMA reads x's NCHW boxes from a 16-byte boundary before each window and
    # the consumers split the window in shared memory.
    fam = ConvTf32x3Sm90()
    skip_unless_sm90(sup, "wgmma needs sm_90a")
    p = conv_problem(tmp_path, layer, x_shape, tail)
    configs = [d for d in ({**c, "DIRECT": 1, "FOLD": 0} for c in family_configs(fam, p, 1)) if fam.valid(d, p)]
    assert configs, layer
    configs += [d for d in ({**configs[0], "PERSIST": 1, "OVERLAP": o} for o in (0, 1)) if fam.valid(d, p)]
    assert_all_ok(sup, fam, p, configs, CFG)


@pytest.mark.parametrize("layer, x_shape, tail", [
    ("nn.ConvTranspose1d(32, 64, 3, stride=2, padding=1, dilation=2)", "(2, 32, 1000)", "y"),  # half the pixels unreached
    ("nn.ConvTranspose1d(6, 10, 1, stride=2)", "(2, 6, 52)", "y"),  # odd outputs: no tap reaches them (the bias)
    ("nn.ConvTranspose2d(32, 64, 3, stride=5, padding=1, dilation=2)", "(2, 32, 12, 16)", "y"),
    ("nn.ConvTranspose2d(32, 64, 3, stride=2, padding=1, output_padding=1)", "(3, 32, 17, 16)", "torch.tanh(y) - self.bias"),
    ("nn.ConvTranspose2d(16, 24, (4, 3), stride=(2, 3), padding=(1, 0), dilation=(1, 2))", "(2, 16, 9, 12)", "y"),
    ("nn.ConvTranspose3d(8, 16, 3, stride=2, padding=1, output_padding=1)", "(2, 8, 6, 7, 8)", "y * 2"),
])
def test_transposed_tiles_spanning_every_phase_of_w(sup, tmp_path, layer, x_shape, tail):
    # DENSE_W: a tile is TW consecutive output pixels along W; each tap's split gives the pixels of other
    # phases zeros. With and without persistent grids.
    fam = ConvTf32x3Sm90()
    skip_unless_sm90(sup, "wgmma needs sm_90a")
    p = conv_problem(tmp_path, layer, x_shape, tail)
    direct = [c for c in family_configs(fam, p, 2) if c.get("DIRECT")]
    configs = [d for c in direct for d in ({**c, "DENSE_W": 1}, {**c, "DENSE_W": 1, "PERSIST": 1}) if fam.valid(d, p)]
    configs = [c for i, c in enumerate(configs) if c not in configs[:i]]
    assert configs, layer
    assert_all_ok(sup, fam, p, configs[:4], CFG)


@pytest.mark.parametrize("layer, x_shape, tail", [
    ("nn.ConvTranspose2d(64, 48, 5, stride=1, padding=1)", "(3, 64, 14, 13)", "torch.relu(y) + self.bias"),  # level2/11's
    ("nn.Conv2d(37, 50, 3, padding=1, bias=False)", "(3, 37, 20, 21)", "y * 2"),  # a channel tail past 32
    ("nn.Conv2d(16, 24, (3, 5), padding=(2, 1), dilation=(2, 3))", "(2, 16, 19, 23)", "torch.tanh(y)"),
    ("nn.ConvTranspose2d(32, 40, (3, 4), padding=(2, 0), dilation=(1, 2), output_padding=(0, 1))", "(2, 32, 11, 15)", "y"),
    ("nn.ConvTranspose2d(16, 24, 3, padding=3)", "(2, 16, 12, 17)", "y"),  # the plane starts past x's first row
    ("nn.Conv2d(32, 64, 3)", "(4, 32, 18, 18)", "torch.relu(y).mean(dim=(2, 3))"),  # pooled: dropped pixels unsummed
    ("nn.Conv3d(16, 24, 3, padding=1)", "(2, 16, 5, 9, 11)", "torch.relu(y) + self.bias.unsqueeze(-1)"),  # depths
    ("nn.ConvTranspose3d(16, 24, (2, 3, 3), padding=(0, 1, 1), dilation=(2, 1, 1))", "(2, 16, 5, 8, 10)", "y"),
])
def test_flat_tiles_over_padded_planes(sup, tmp_path, layer, x_shape, tail):
    # FLAT: 128 flat indices (of one depth, 3-D) of planes padded to the output's width plus the kernel's reach, a box
    # a tap (or four of 32); the indices past each row's outputs and the planes' end are computed and dropped. Also
    # persistent.
    fam = ConvTf32x3Sm90()
    skip_unless_sm90(sup, "wgmma needs sm_90a")
    p = conv_problem(tmp_path, layer, x_shape, tail)
    first = fam.seeds(p)[0]
    flat = {**first, "FLAT": 1, "TW": 128, "TH": 1, "FOLD": 0, "DIRECT": 0, "DENSE_W": 0, "STAGES": 3}
    configs = [flat, {**flat, "TW": 32, "BN": 64}, {**flat, "BN": 64, "PERSIST": 1, "OVERLAP": 1}]
    assert all(fam.valid(c, p) for c in configs), layer
    assert_all_ok(sup, fam, p, configs, CFG)


@pytest.mark.parametrize("layer, x_shape, tail", [
    ("nn.Conv2d(64, 128, 3, padding=1)", "(4, 64, 56, 56)", "torch.relu(y)"),
    ("nn.Conv2d(32, 64, (3, 5), stride=(2, 1), padding=(1, 2), dilation=(2, 1))", "(8, 32, 64, 66)", "y"),
    ("nn.Conv3d(16, 32, 3, padding=1)", "(2, 16, 12, 20, 24)", "y * 2"),
    ("nn.Conv2d(256, 192, 1)", "(8, 256, 32, 32)", "y"),
])
def test_one_tf32_pass_is_correct_under_pytorch_and_a_downgrade_under_fp32(sup, tmp_path, layer, x_shape, tail):
    # PASSES 1 computes what cuDNN computes under PyTorch's default flags: judged by the `pytorch`
    # contract's bound (PyTorch's own TF32 error against float64) it passes; under `fp32` it may not.
    fam = ConvTf32x3Sm90()
    skip_unless_sm90(sup, "wgmma needs sm_90a")
    p = conv_problem(tmp_path, layer, x_shape, tail).under("pytorch")
    ones = [c for c in fam.seeds(p) if c.get("PASSES") == 1]
    assert ones
    default = EvalConfig(baselines=("torch",), max_timing_s=0.3, min_samples=5, profile=False, precision="pytorch")
    assert_all_ok(sup, fam, p, ones[:3], default)
    strict = sup.evaluate(p, fam.render(ones[0], p), EvalConfig(baselines=("torch",), max_timing_s=0.3, min_samples=5,
                                                               profile=False, precision="fp32"))
    assert strict.status in ("cheat:precision_downgrade", "wrong_output"), (layer, strict.status, strict.message)
