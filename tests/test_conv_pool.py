"""A convolution whose forward ends in a global pooling (a mean or sum of each image's pixels per channel,
KernelBench level2/67's conv, GELU, adaptive_avg_pool2d(x, 1)): the implicit GEMM sums its epilogue's
values per channel and adds each tile's sums into the [N, C_out] output, never writing the convolution's
output. On the CPU: what is matched and with what scale, what is declined and why, the launch (a zeroed
output of the pooled shape; a persistent grid), NVRTC compiles."""

import math

import pytest

from cuforge.kernels.conv import ConvTf32x3Sm90
from cuforge.kernels.conv_match import match_conv
from cuforge.kernels.conv_direct import ConvDirect
from cuforge.kernels.families import families_for
from template_helpers import conv_problem, smoke_compile

FAM = ConvTf32x3Sm90()


@pytest.mark.parametrize("layer, x_shape, tail, scale, shape", [
    ("nn.Conv2d(8, 64, 3)", "(2, 8, 20, 21)", "F.adaptive_avg_pool2d(F.gelu(y), 1).squeeze(-1).squeeze(-1)",
     1 / (18 * 19), (2, 64)),
    ("nn.Conv2d(8, 16, 3)", "(2, 8, 20, 21)", "torch.sum(torch.relu(self.bias + y), dim=(2, 3), keepdim=True) * 2",
     2.0, (2, 16, 1, 1)),
    ("nn.ConvTranspose2d(16, 32, 3, stride=2, padding=1, output_padding=1)", "(2, 16, 9, 10)",
     "torch.mean(y * 0.5, dim=[2, 3], keepdim=True)", 1 / (18 * 20), (2, 32, 1, 1)),
    ("nn.Conv3d(16, 32, 3)", "(2, 16, 6, 7, 8)", "y.mean(dim=(-1, -2, -3)) / 4", 1 / (4 * 5 * 6) / 4, (2, 32)),
    ("nn.Conv1d(16, 32, 3)", "(3, 16, 40)", "y.sum(-1)", 1.0, (3, 32)),
])
def test_a_global_pool_after_the_chain_is_summed_in_the_epilogue(tmp_path, layer, x_shape, tail, scale, shape):
    p = conv_problem(tmp_path, layer, x_shape, tail)
    f = match_conv(p)
    assert not isinstance(f, str), f
    assert math.isclose(f.pool, scale, rel_tol=1e-12) and f.pooled_shape == shape
    assert families_for(p)[0][0].name == FAM.name  # one kernel, not a convolution and a reduction
    cand = FAM.render(FAM.seeds(p)[0], p)
    assert cand.launch.outputs == ((repr(shape), "float32", "zeros"),)  # accumulated into by atomics
    assert "#define POOL 1" in cand.source
    smoke_compile(FAM, p, 1)


def test_without_a_pool_nothing_is_summed(tmp_path):
    p = conv_problem(tmp_path, "nn.Conv2d(8, 16, 3)", "(2, 8, 20, 21)", "torch.relu(y)")
    f = match_conv(p)
    assert f.pool == 0 and f.pooled_shape == ()
    cand = FAM.render(FAM.seeds(p)[0], p)
    assert "#define POOL 0" in cand.source and cand.launch.outputs == (("(NB, CO, OH, OW)", "float32"),)


@pytest.mark.parametrize("tail, why", [
    ("torch.mean(y, dim=(2, 3)) + 1", "add after the pooling is not a scale by a constant"),
    ("torch.mean(y, dim=(2, 3)).flatten()", "reshapes it to [32]"),
    ("torch.mean(y, dim=(2, 3)) * 0", "scaled by 0.0"),
    ("(torch.mean(y, dim=(2, 3)), y)", "not the pooled values"),
])
def test_what_follows_a_pool_must_be_a_constant_scale_or_a_view(tmp_path, tail, why):
    p = conv_problem(tmp_path, "nn.Conv2d(8, 16, 3)", "(2, 8, 20, 21)", tail)
    reason = match_conv(p)
    assert isinstance(reason, str) and why in reason, reason


def test_a_mean_over_some_spatial_dims_is_not_a_global_pool(tmp_path):
    p = conv_problem(tmp_path, "nn.Conv2d(8, 16, 3)", "(2, 8, 20, 21)", "torch.mean(y, dim=3)")
    reason = match_conv(p)
    assert isinstance(reason, str) and "mean" in reason, reason


def test_a_pool_then_more_ops_is_a_pooled_head_and_a_tail(tmp_path):
    # KernelBench level2/42's shape: the pooled convolution is the first kernel of several.
    p = conv_problem(tmp_path, "nn.ConvTranspose2d(16, 32, 3)", "(2, 16, 9, 10)",
                     "torch.logsumexp(torch.mean(y, dim=(2, 3), keepdim=True) + self.bias, dim=1, keepdim=True)")
    fam = families_for(p)[0][0]
    assert fam.name.startswith(("staged:conv_tf32x3_sm90", "pipeline")), fam.name
    head = fam.matched(p)
    head = head.head if hasattr(head, "head") else head[0].problem
    assert match_conv(head).pool == 1 / (11 * 12)


def test_the_direct_convolution_declines_a_pooled_output(tmp_path):
    p = conv_problem(tmp_path, "nn.Conv2d(8, 64, 3, groups=4)", "(2, 8, 20, 21)", "torch.mean(y, dim=(2, 3))")
    assert "pooled" in ConvDirect().supports(p)


def test_a_persistent_grid_has_a_block_per_sm_at_most(tmp_path):
    p = conv_problem(tmp_path, "nn.Conv2d(8, 64, 3)", "(2, 8, 20, 21)", "torch.relu(y)")
    c = FAM.seeds(p)[0]
    one_each = FAM.render({**c, "PERSIST": 0}, p).launch.grid
    persistent = FAM.render({**c, "PERSIST": 1}, p).launch.grid
    assert persistent == f"(min({one_each[1:-2]}, SMS),)", (one_each, persistent)
    assert dict(FAM.render({**c, "PERSIST": 1}, p).launch.bindings)["SMS"].endswith(".multi_processor_count")
    assert FAM.render(c, p).launch.grid == one_each  # the default: one block a tile
