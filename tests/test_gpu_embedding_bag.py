"""The embedding-bag family on a real GPU, judged against float64 at the bound PyTorch's own result in
that dtype sets: sum and mean, rows of 16-byte words and rows that are not, bags of several lengths
(the last one to the end of the indices), every seed."""

import pytest

from cuforge.kernels.embedding_bag import EmbeddingBag
from cuforge.sandbox.protocol.evaluation import EvalConfig
from test_embedding_bag import bag_problem

pytestmark = pytest.mark.gpu
CFG = EvalConfig(baselines=("torch",), max_timing_s=0.3, min_samples=5, profile=False)


@pytest.mark.parametrize("dtype", ["torch.float32", "torch.bfloat16", "torch.float16"])
def test_embedding_bags(sup, tmp_path, dtype):
    fam = EmbeddingBag()
    for rows, dim, bags, per_bag, mode in ((100000, 128, 4096, 20, "sum"), (1000, 100, 64, 7, "mean"), (50, 3, 9, 1, "sum")):
        p = bag_problem(tmp_path, rows, dim, bags, per_bag, mode, dtype)
        assert fam.supports(p) is None, fam.supports(p)
        for c in fam.seeds(p):
            ev = sup.evaluate(p, fam.render(c, p), CFG)
            assert ev.status == "ok", (rows, dim, mode, dtype, c, ev.status, ev.message)
