"""The embedding-bag family on a real GPU, judged against float64 at the bound PyTorch's own result in
that dtype sets: sum and mean, rows of 16-byte words and rows that are not, bags of several lengths
(the last one to the end of the indices), every seed."""

import pytest

from cuforge.kernels.embedding_bag import EmbeddingBag
from template_helpers import assert_all_ok
from test_embedding_bag import bag_problem

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", ["torch.float32", "torch.bfloat16", "torch.float16"])
def test_embedding_bags(sup, tmp_path, dtype):
    fam = EmbeddingBag()
    for rows, dim, bags, per_bag, mode in ((100000, 128, 4096, 20, "sum"), (1000, 100, 64, 7, "mean"), (50, 3, 9, 1, "sum")):
        p = bag_problem(tmp_path, rows, dim, bags, per_bag, mode, dtype)
        assert fam.supports(p) is None, fam.supports(p)
        assert_all_ok(sup, fam, p, fam.seeds(p), what=(rows, dim, mode, dtype))
