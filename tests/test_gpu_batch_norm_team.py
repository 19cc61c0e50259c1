"""The whole-GPU batch norm family on a real GPU (sm_90) against the float64 reference at the harness's fp32
tolerance: channels with a tail read twice (KernelBench's 64 MiB channels) and ones kept whole, a span no
float4 divides (element by element) with a chain, no affine in 3-D, and inputs of mean 100 and std 0.5
(the statistics' cancellation); each family seed (shared memory alone, a register part, deeper loads)
plus random configs."""

import pytest

from cuforge.kernels.batch_norm_team import BatchNormTeam
from template_helpers import CFG, check_family, problem_from_expr, skip_unless_sm90
from test_batch_norm import bn_problem

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("layer, x_shape, tail", [
    ("nn.BatchNorm2d(3)", "(16, 3, 1024, 1024)", "y"),
    ("nn.BatchNorm2d(2)", "(4, 2, 1024, 1024)", "torch.relu(y) * 2"),
    ("nn.BatchNorm1d(2, eps=1e-3)", "(9, 2, 1048577)", "torch.tanh(y)"),
    ("nn.BatchNorm3d(3, affine=False)", "(2, 3, 64, 128, 256)", "y * 3"),
])
def test_batch_norm_across_the_gpu(sup, tmp_path, layer, x_shape, tail):
    skip_unless_sm90(sup, "a block keeps up to 227 KiB of its share in shared memory")
    p = bn_problem(tmp_path, layer, x_shape, tail)
    fam = BatchNormTeam()
    check_family(sup, fam, p, CFG)


def test_statistics_of_inputs_far_from_zero(sup, tmp_path):
    skip_unless_sm90(sup, "a block keeps up to 227 KiB of its share in shared memory")
    init = "        self.bn = nn.BatchNorm2d(2)\n        nn.init.normal_(self.bn.weight)\n        nn.init.normal_(self.bn.bias)"
    p = problem_from_expr(tmp_path, "self.bn(a)", "torch.randn(16, 2, 1024, 1024) * 0.5 + 100.0", args="a", init=init)
    check_family(sup, BatchNormTeam(), p, CFG, n_random=0)
