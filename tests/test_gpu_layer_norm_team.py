"""The whole-GPU layer norm family on a real GPU (sm_90) against the float64 reference at the harness's fp32
tolerance: KernelBench's 16 MiB rows with a tail read twice, a weight without a bias and a chain, rows
kept whole, and inputs of mean 100 and std 0.5 (the statistics' cancellation); each family seed plus
random configs, with weight and bias drawn at random so that a slot read from the wrong place shows."""

import pytest

from cuforge.kernels.layer_norm_team import LayerNormTeam
from template_helpers import CFG, assert_all_ok, check_family, problem_from_expr, skip_unless_sm90

pytestmark = pytest.mark.gpu
INIT = "        self.ln = nn.LayerNorm({0})\n        nn.init.normal_(self.ln.weight)"
BIAS = "\n        nn.init.normal_(self.ln.bias)"


@pytest.mark.parametrize("expr, layer, inputs", [
    ("self.ln(a)", "(64, 256, 256)", "torch.randn(16, 64, 256, 256)"),
    ("torch.relu(self.ln(a)) * 2", "(4, 1024, 1024), eps=1e-3, bias=False", "torch.randn(3, 4, 1024, 1024) * 2 - 1"),
    ("torch.tanh(self.ln(a)) + 1", "(1048576,)", "torch.rand(5, 1048576)"),
    ("self.ln(a)", "(64, 256, 256)", "torch.randn(4, 64, 256, 256) * 0.5 + 100.0"),
])
def test_layer_norm_across_the_gpu(sup, tmp_path, expr, layer, inputs):
    skip_unless_sm90(sup, "a block keeps its share of the bias and the row in up to 227 KiB of shared memory")
    init = INIT.format(layer) + ("" if "bias=False" in layer else BIAS)
    check_family(sup, LayerNormTeam(), problem_from_expr(tmp_path, expr, inputs, args="a", init=init), CFG)


@pytest.mark.parametrize("expr, layer, inputs", [
    ("self.ln(a)", "(64, 256, 256)", "torch.randn(16, 64, 256, 256)"),
    ("torch.relu(self.ln(a)) * 2", "(4, 1024, 1024), eps=1e-3, bias=False", "torch.randn(3, 4, 1024, 1024) * 2 - 1"),
])
def test_shares_brought_by_bulk_copies(sup, tmp_path, expr, layer, inputs):
    skip_unless_sm90(sup, "bulk copies and a block's share of the row need Hopper")
    init = INIT.format(layer) + ("" if "bias=False" in layer else BIAS)
    fam = LayerNormTeam()
    p = problem_from_expr(tmp_path, expr, inputs, args="a", init=init)
    configs = [dict(BLOCK=512, BULK=2, PREFETCH=2), dict(BLOCK=512, BULK=6, PREFETCH=0), dict(BLOCK=256, BULK=3, PREFETCH=1)]
    assert all(fam.valid(c, p) for c in configs)
    assert_all_ok(sup, fam, p, configs, CFG)
