"""The direct convolution family (grouped, depthwise, few input channels) on the CPU: what it matches and
what it leaves to the implicit GEMM, its knobs' validity, the depthwise-separable pair as two kernels, and NVRTC
compiles of its seeds and random configs over 1-D, 2-D and 3-D, strided, padded, dilated and
transposed shapes."""

import pytest

from cuforge.kernels.conv import ConvTf32x3Sm90
from cuforge.kernels.conv_direct import ConvDirect
from cuforge.kernels.families import families_for
from template_helpers import conv_problem, problem_from_expr, smoke_compile

FAM = ConvDirect()

SHAPES = [
    ("nn.Conv2d(16, 16, 3, groups=16)", "(2, 16, 20, 21)"),  # depthwise
    ("nn.Conv2d(8, 24, (3, 1), stride=2, padding=(1, 0), groups=8)", "(2, 8, 17, 9)"),  # channel multiplier 3
    ("nn.Conv1d(12, 18, 5, stride=3, padding=2, dilation=2, groups=6)", "(3, 12, 100)"),
    ("nn.Conv3d(8, 16, 3, padding=1, groups=4)", "(2, 8, 5, 6, 7)"),
    ("nn.ConvTranspose2d(8, 16, (3, 5), stride=(2, 3), padding=(1, 2), dilation=(1, 2), groups=4)", "(2, 8, 9, 10)"),
    ("nn.ConvTranspose3d(8, 8, 3, stride=2, padding=1, output_padding=1, groups=2)", "(2, 8, 4, 5, 6)"),
    # Ungrouped, few input channels (KernelBench's 3-D convolutions of an RGB image, level2/23 and 48).
    ("nn.Conv3d(3, 24, 3)", "(2, 3, 6, 10, 13)"),
    ("nn.Conv3d(8, 16, (3, 2, 4), stride=(1, 2, 1), padding=(0, 1, 2))", "(2, 8, 5, 9, 11)"),
    ("nn.Conv2d(3, 20, 5, stride=2, padding=2)", "(3, 3, 19, 23)"),
    ("nn.ConvTranspose2d(4, 12, 3, stride=2)", "(2, 4, 7, 9)"),
]


def test_grouped_and_depthwise_convolutions_go_to_the_direct_kernel(tmp_path):
    p = conv_problem(tmp_path, "nn.Conv2d(32, 32, 3, groups=32)", "(2, 32, 30, 31)", "torch.relu(y) + self.bias")
    fams = [f.name for f in families_for(p)[0]]
    assert fams[0] == FAM.name and ConvTf32x3Sm90().name not in fams
    f = FAM.matched(p)
    assert (f.groups, f.c, f.c_out, f.out_spatial) == (32, 32, 32, (28, 29))
    assert [kind for _, kind in f.epilogue.tensors] == ["ch", "ch"]  # the conv's bias, then self.bias
    # 8 pixels a thread moved 16 bytes at a time lead; strided along W, the shared-weight seeds do
    assert FAM.seeds(p)[0] == {"BLOCK": 256, "OCT": 1, "PW": 8, "WIN": 1, "VW": 1}
    strided = conv_problem(tmp_path, "nn.Conv2d(32, 32, 3, stride=2, groups=32)", "(2, 32, 30, 31)")
    assert not any(c.get("VW") for c in FAM.seeds(strided)) and FAM.seeds(strided)[0]["WIN"] == 1
    ungrouped = conv_problem(tmp_path, "nn.Conv2d(16, 16, 3)", "(2, 16, 10, 10)")
    assert "not a grouped convolution, and more than 8 input channels" in FAM.supports(ungrouped)


def test_few_input_channels_are_direct_and_lead_the_implicit_gemm_unless_transposed_or_pooled(tmp_path):
    rgb3d = conv_problem(tmp_path, "nn.Conv3d(3, 16, 3)", "(2, 3, 6, 8, 8)", "torch.sigmoid(y)")
    assert [f.name for f in families_for(rgb3d)[0]] == [FAM.name]  # 3-D into few channels: direct alone
    assert "conv_direct's case" in ConvTf32x3Sm90().supports(rgb3d)
    rgb2d = conv_problem(tmp_path, "nn.Conv2d(8, 16, 3)", "(2, 8, 10, 10)")
    assert [f.name for f in families_for(rgb2d)[0]][:2] == [FAM.name, ConvTf32x3Sm90().name]
    wide = conv_problem(tmp_path, "nn.Conv3d(3, 64, 3)", "(2, 3, 6, 8, 8)")
    assert [f.name for f in families_for(wide)[0]][:2] == [FAM.name, ConvTf32x3Sm90().name]
    transposed = conv_problem(tmp_path, "nn.ConvTranspose3d(3, 16, 3)", "(2, 3, 6, 8, 8)")
    assert [f.name for f in families_for(transposed)[0]][:2] == [ConvTf32x3Sm90().name, FAM.name]
    many = conv_problem(tmp_path, "nn.Conv2d(16, 32, 3)", "(2, 16, 10, 10)")
    assert [f.name for f in families_for(many)[0]] == [ConvTf32x3Sm90().name, "conv_rows_f32"]
    # Pooled in the implicit GEMM's epilogue: one kernel ahead of a direct head and a reduction after it.
    pooled = conv_problem(tmp_path, "nn.Conv2d(8, 64, 3)", "(2, 8, 20, 21)", "torch.mean(torch.relu(y), dim=(2, 3))")
    assert [f.name for f in families_for(pooled)[0]][:2] == [ConvTf32x3Sm90().name, "staged:conv_direct+reduce_dim"]
    # Two kernels: a direct head leads the implicit GEMM's with the same tail.
    init = "        self.conv = nn.Conv2d(8, 32, 3)\n        self.bn = nn.BatchNorm2d(32)"
    staged = problem_from_expr(tmp_path, "self.bn(self.conv(a)) * 2", "torch.randn(2, 8, 20, 20)", args="a", init=init)
    names = [f.name for f in families_for(staged)[0]]
    assert names.index("staged:conv_direct+batch_norm") < names.index("staged:conv_tf32x3_sm90+batch_norm"), names
    f = FAM.matched(rgb3d)
    assert (f.groups, f.c, f.c_out) == (1, 3, 16)


def test_output_channels_per_thread_divide_a_group_and_transposed_ones_take_one_pixel(tmp_path):
    p = conv_problem(tmp_path, "nn.ConvTranspose2d(8, 24, 3, stride=2, groups=2)", "(2, 8, 9, 10)")
    assert FAM.valid({"BLOCK": 256, "OCT": 4, "PW": 1}, p)
    assert not FAM.valid({"BLOCK": 256, "OCT": 8, "PW": 1}, p)  # 12 output channels a group
    assert not FAM.valid({"BLOCK": 256, "OCT": 4, "PW": 2}, p)
    assert all(FAM.valid(c, p) for c in FAM.seeds(p))
    launch = FAM.render(FAM.seeds(p)[0], p).launch
    assert launch.outputs == ((repr((2, 24, 19, 21)), "float32"),)
    assert ("items", str(2 * (24 // 4) * 19 * 21)) in launch.bindings


def test_windowed_blocks_share_output_channels_and_keep_their_weights_in_shared_memory(tmp_path):
    p = conv_problem(tmp_path, "nn.Conv2d(3, 96, 11, stride=4, padding=2)", "(2, 3, 63, 61)")
    c = dict(BLOCK=256, OCT=8, PW=4, WIN=1)
    assert FAM.valid(c, p)
    launch = FAM.render(c, p).launch
    assert launch.grid == "(cdiv(items, 256), 12)" and launch.shared_mem == str(8 * 3 * 121 * 4)
    assert ("items", str(2 * 15 * 4)) in launch.bindings  # images x output rows x groups of 4 pixels (15 wide)
    assert "SPAN = 23;" in FAM.render(c, p).source  # 3 x stride 4 + 10 taps + 1 values under a thread's pixels
    transposed = conv_problem(tmp_path, "nn.ConvTranspose2d(4, 12, 3, stride=2)", "(2, 4, 7, 9)")
    assert not FAM.valid(dict(BLOCK=256, OCT=4, PW=1, WIN=1), transposed)
    huge = conv_problem(tmp_path, "nn.Conv3d(8, 32, 15)", "(1, 8, 16, 16, 16)")  # 16 x 8 x 3375 x 4 bytes of weights
    assert FAM.valid(dict(BLOCK=256, OCT=1, PW=1, WIN=1), huge) and not FAM.valid(dict(BLOCK=256, OCT=16, PW=1, WIN=1), huge)


def test_a_depthwise_separable_pair_runs_as_two_kernels(tmp_path):
    init = "        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)\n        self.pw = nn.Conv2d(16, 32, 1)"
    p = problem_from_expr(tmp_path, "self.pw(self.dw(a))", "torch.randn(2, 16, 24, 24)", args="a", init=init)
    fam = families_for(p)[0][0]
    assert fam.name == "staged:conv_direct+conv_tf32x3_sm90"
    cut = fam.matched(p)
    assert [n.op for n in cut.head.graph] == ["convolution"] and [n.op for n in cut.tail.graph] == ["convolution"]
    smoke_compile(fam, p, 1)


@pytest.mark.parametrize("layer, x_shape", SHAPES)
def test_seeds_and_random_configs_compile(tmp_path, layer, x_shape):
    p = conv_problem(tmp_path, layer, x_shape, "torch.tanh(y) * 2")
    assert FAM.supports(p) is None, FAM.supports(p)
    smoke_compile(FAM, p, 3)
