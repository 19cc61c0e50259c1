"""The embedding-bag family on the CPU: nn.EmbeddingBag in sum and mean mode with 1-D indices and
offsets, in fp32, bf16 and fp16 (the models suite's recommendation feature among them), what it
refuses and why, and that its kernels compile with NVRTC. On a GPU: tests/test_gpu_embedding_bag.py."""

import pytest

from cuforge.kernels.embedding_bag import EmbeddingBag, match_embedding_bag
from cuforge.kernels.families import families_for
from cuforge.problems.suites import load_suite
from template_helpers import problem_from_expr, smoke_compile


def bag_problem(tmp_path, rows, dim, bags, per_bag, mode="sum", dtype="torch.float32", extra=""):
    init = f"        self.bag = nn.EmbeddingBag({rows}, {dim}, mode='{mode}'{extra}).to({dtype})"
    inputs = f"torch.randint(0, {rows}, ({bags * per_bag},)), torch.arange(0, {bags * per_bag}, {per_bag})"
    return problem_from_expr(tmp_path, "self.bag(i, o)", inputs, "i, o", init)


@pytest.mark.parametrize("dtype", ["torch.float32", "torch.bfloat16", "torch.float16"])
@pytest.mark.parametrize("mode, dim", [("sum", 128), ("mean", 100), ("sum", 3)])
def test_sum_and_mean_bags_in_every_dtype(tmp_path, dtype, mode, dim):
    p = bag_problem(tmp_path, 1000, dim, 64, 7, mode, dtype)
    found = match_embedding_bag(p)
    assert not isinstance(found, str), found
    assert found.mean == (mode == "mean") and found.dtype == dtype.split(".")[1]
    fam = EmbeddingBag()
    assert families_for(p)[0][0].name == "embedding_bag"
    seeds = fam.seeds(p)
    assert seeds and all(fam.valid(c, p) for c in seeds)
    vector = 4 if dtype == "torch.float32" else 8  # elements in 16 bytes: such loads where rows are whole words
    assert (seeds[0]["VEC"] == vector) if dim % vector == 0 else all(c["VEC"] == 1 for c in seeds)
    smoke_compile(fam, p, 2)


def test_what_it_refuses_it_names(tmp_path):
    fam = EmbeddingBag()
    assert "mode 2" in fam.supports(bag_problem(tmp_path, 100, 16, 8, 3, "max"))
    assert "padding_idx" in fam.supports(bag_problem(tmp_path, 100, 16, 8, 3, extra=", padding_idx=0"))


def test_the_models_suites_bags_are_covered():
    suite = {p.id: p for p in load_suite("models").problems}
    for variant in ("", "@bf16", "@fp16"):
        assert families_for(suite["models/embedding_bag" + variant])[0][0].name == "embedding_bag"
