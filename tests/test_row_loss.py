"""The row-reduction loss family on the CPU: a triplet margin loss and other losses built from per-row
norms, sums and means are matched (and the ones that are not say why), and the configs compile."""

import pytest

from cuforge.kernels.families import families_for
from cuforge.kernels.row_loss import RowLoss
from template_helpers import problem_from_expr, smoke_compile

FAM = RowLoss()
THREE = "torch.randn(64, 96), torch.randn(64, 96), torch.randn(64, 96)"
LOSSES = [
    ("F.triplet_margin_loss(a, b, c, margin=0.5)", THREE, "a, b, c"),
    ("torch.mean(torch.sum((a - b) ** 2, dim=1))", "torch.randn(32, 50), torch.randn(32, 50)", "a, b"),
    ("torch.sum(torch.relu(1.0 - torch.mean(a * b, dim=-1)))", "torch.randn(4, 8, 40), torch.randn(4, 8, 40)", "a, b"),
    ("torch.mean(torch.norm(a, dim=1) - torch.norm(b, dim=1))", "torch.randn(16, 33), torch.randn(16, 33)", "a, b"),
]


@pytest.mark.parametrize("expr, inputs, args", LOSSES)
def test_losses_over_row_reductions_are_matched_and_compile(tmp_path, expr, inputs, args):
    p = problem_from_expr(tmp_path, expr, inputs, args=args)
    assert families_for(p)[0][0].name == FAM.name, families_for(p)[1]
    smoke_compile(FAM, p, 2)


def test_the_triplet_loss_reads_each_input_once_per_element(tmp_path):
    p = problem_from_expr(tmp_path, LOSSES[0][0], THREE, args="a, b, c")
    m = FAM.matched(p)
    assert (m.rows, m.cols, m.inputs, m.mean) == (64, 96, (0, 1, 2), True)
    assert [r.kind for r in m.reductions] == ["norm2", "norm2"]
    launch = FAM.render(FAM.seeds(p)[0], p).launch
    assert launch.pre[0][0] == "row_loss_rows" and launch.scratch == (("(1,)", "float64", "zeros"),)


@pytest.mark.parametrize("expr, inputs, args, why", [
    ("torch.sum(a - b, dim=0).mean()", "torch.randn(8, 9), torch.randn(8, 9)", "a, b", "elementwise"),
    ("torch.mean(a - b)", "torch.randn(8, 9), torch.randn(8, 9)", "a, b", "no reduction"),
    ("torch.sum(a, dim=1)", "torch.randn(8, 9)", "a", "scalar"),
    ("torch.mean(torch.sum(a, dim=1) * a[:, 0])", "torch.randn(8, 9)", "a", ""),
])
def test_what_is_not_a_row_loss_says_why(tmp_path, expr, inputs, args, why):
    reason = FAM.supports(problem_from_expr(tmp_path, expr, inputs, args=args))
    assert reason is not None and why in reason, reason
