"""Row-reduction losses on a real GPU against the float64 reference at the harness's fp32 tolerance:
the triplet margin loss (KernelBench's level1/99 at a smaller size), a squared-distance mean, a hinge
over row means of a 3-D input, a difference of row norms; 4-wide and scalar loads, rows grid-strided."""

import pytest

from cuforge.kernels.row_loss import RowLoss
from template_helpers import CFG, assert_all_ok, family_configs, problem_from_expr
from test_row_loss import LOSSES

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("expr, inputs, args", LOSSES + [
    ("F.triplet_margin_loss(a, b, c)", "torch.rand(4096, 1024) * 2, torch.rand(4096, 1024), torch.rand(4096, 1024)", "a, b, c"),
])
def test_row_loss(sup, tmp_path, expr, inputs, args):
    fam = RowLoss()
    p = problem_from_expr(tmp_path, expr, inputs, args=args)
    assert_all_ok(sup, fam, p, family_configs(fam, p, 1), CFG)
