"""Recurrent cells as one kernel on a real GPU: nn.LSTMCell and nn.GRUCell of the models suite in fp32
(three TF32 products, judged at fp32's bound), bf16 and fp16 (mma.sync, fp32 accumulation), every
seed; and odd sizes where the batch is no whole tile and the hidden size no whole block of units, also
with the k tiles split over clusters of 2 and 4 blocks (uneven slices that cross from one projection to
the next)."""

import pytest

from cuforge.kernels.gated_cell import GatedCell
from cuforge.problems.loader import load_in_dtype
from cuforge.problems.suites import load_problem
from template_helpers import assert_all_ok, problem_from_expr

pytestmark = pytest.mark.gpu

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
CLUSTER_CONFIGS = [dict(BM=16, BN=8, BK=32, WM=1, WN=1, KS=1, STAGES=2, CL=2),
                   dict(BM=32, BN=8, BK=32, WM=2, WN=1, KS=2, STAGES=3, CL=4)]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("ref", ["models/lstm_cell", "models/gru_cell"])
def test_the_models_suite_s_cells(sup, ref, dtype):
    fam = GatedCell()
    p = load_problem(ref) if dtype == "fp32" else load_in_dtype(load_problem(ref), dtype)
    assert fam.supports(p) is None
    assert_all_ok(sup, fam, p, fam.seeds(p), what=(ref, dtype))


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_odd_batches_and_hidden_sizes(sup, tmp_path, dtype):
    fam = GatedCell()
    dt = f"torch.{DTYPES[dtype]}"
    cases = [("self.cell(x, (h, c))", "x, h, c", f"torch.randn(5, 24, dtype={dt}), torch.randn(5, 40, dtype={dt}), "
              f"torch.randn(5, 40, dtype={dt})", f"        self.cell = nn.LSTMCell(24, 40).to({dt})"),
             ("self.cell(x, h)", "x, h", f"torch.randn(37, 72, dtype={dt}), torch.randn(37, 104, dtype={dt})",
              f"        self.cell = nn.GRUCell(72, 104).to({dt})"),
             ("(lambda g: torch.sigmoid(g[0]) * h + (1 - torch.sigmoid(g[0])) * torch.tanh(g[1]))"
              "((self.ih(x) + self.hh(h)).chunk(2, 1))", "x, h",
              f"torch.randn(19, 24, dtype={dt}), torch.randn(19, 40, dtype={dt})",
              f"        self.ih = nn.Linear(24, 80).to({dt})\n        self.hh = nn.Linear(40, 80, bias=False).to({dt})")]
    for expr, args, inputs, init in cases:
        p = problem_from_expr(tmp_path, expr, inputs, args=args, init=init, prefix="gpu")
        assert fam.supports(p) is None, (expr, fam.supports(p))
        clusters = [c for c in CLUSTER_CONFIGS if fam.valid(c, p)]
        assert clusters, expr
        assert_all_ok(sup, fam, p, fam.seeds(p)[:3] + clusters, what=(expr, dtype))
