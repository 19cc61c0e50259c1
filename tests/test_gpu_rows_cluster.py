"""The cluster-per-row family on a real GPU (sm_90) against the float64 reference: softmax and
log-softmax (fp32 and fp16, misaligned rows, a fused prologue), L1/L2/RMS row norms, instance, group
and layer norm with their affine parameters and a fused epilogue, rows held on chip and rows too long
for it (read twice); each family seed plus random configs.
And the normalize family's register-held middle dim."""

import pytest

from cuforge.kernels.normalize import Normalize
from cuforge.kernels.rows_cluster import RowsCluster
from template_helpers import CFG, check_family, problem_from_expr, skip_unless_sm90

pytestmark = pytest.mark.gpu
AFFINE = "\n        nn.init.normal_({0}.weight)\n        nn.init.normal_({0}.bias)"


@pytest.mark.parametrize("expr, inputs, init", [
    ("torch.softmax(a * 0.5, dim=-1)", "torch.randn(6, 393216) * 4", "        pass"),
    ("torch.log_softmax(a, dim=-1)", "torch.randn(3, 70001, dtype=torch.float16) * 4", "        pass"),
    ("torch.softmax(a * 0.5, dim=-1)", "torch.randn(4, 131072, dtype=torch.bfloat16) * 4", "        pass"),
    ("torch.softmax(a, dim=-1)", "torch.randn(5, 100003)", "        pass"),
    ("a / torch.mean(torch.abs(a), dim=1, keepdim=True)", "torch.randn(64, 65535)", "        pass"),
    ("a / torch.norm(a, p=2, dim=1, keepdim=True)", "torch.randn(16, 20001)", "        pass"),
    ("a / torch.sqrt(torch.mean(a ** 2, dim=1, keepdim=True) + 1e-5)", "torch.randn(8, 30000) + 1", "        pass"),
    ("self.gn(a)", "torch.randn(2, 8, 64, 64) * 2 + 1", "        self.gn = nn.GroupNorm(2, 8)" + AFFINE.format("self.gn")),
    ("self.ln(a) * 2.0 + 1.0", "torch.randn(2, 4, 64, 64)", "        self.ln = nn.LayerNorm((4, 64, 64))" + AFFINE.format("self.ln")),
    ("F.instance_norm(a)", "torch.randn(2, 3, 128, 129) * 3 - 1", "        pass"),
    ("torch.log_softmax(a * 2.0, dim=-1)", "torch.randn(3, 1000003)", "        pass"),  # read twice
    ("self.ln(a)", "torch.randn(2, 64, 128, 129)", "        self.ln = nn.LayerNorm((64, 128, 129))" + AFFINE.format("self.ln")),
])
def test_rows_held_on_chip_across_a_cluster(sup, tmp_path, expr, inputs, init):
    skip_unless_sm90(sup, "thread-block clusters need sm_90")
    check_family(sup, RowsCluster(), problem_from_expr(tmp_path, expr, inputs, args="a", init=init), CFG)


def test_a_short_middle_dim_held_in_registers(sup, tmp_path):
    for expr, inputs in (("a / torch.norm(a, p=2, dim=1, keepdim=True)", "torch.randn(4, 3, 50, 50)"),
                         ("a / torch.sqrt(torch.mean(a ** 2, dim=1, keepdim=True) + 1e-5)", "torch.randn(2, 64, 40, 41)")):
        p = problem_from_expr(tmp_path, expr, inputs, args="a")
        assert Normalize().seeds(p)[0]["HOLD"]
        check_family(sup, Normalize(), p, CFG, n_random=1)
