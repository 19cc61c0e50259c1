"""The top-k family on the CPU: what it covers (the models suite's top-k sampling, values or indices
alone, smallest, half dtypes) and refuses with a reason, its launch, and that its seeds compile for sm_90a."""

import pytest

from cuforge.kernels.families import families_for
from cuforge.kernels.topk_rows import TopkRows
from cuforge.problems.suites import load_suite
from template_helpers import problem_from_expr, smoke_compile


def topk(tmp_path, expr, shape="64, 32000", dtype="float32"):
    return problem_from_expr(tmp_path, expr, f"torch.randn({shape}, dtype=torch.{dtype})", "x")


def test_models_suite_topk_sampling_is_covered():
    p = next(q for q in load_suite("models").problems if q.id == "models/topk_sampling")
    fams, _ = families_for(p)
    assert [f.name for f in fams] == ["topk_chunks", "topk_rows"]  # 64 rows: the chunked family leads
    fam = fams[1]
    launch = fam.launch(fam.complete(fam.seeds(p)[0]), p)
    assert launch.outputs == (("(64, 50)", "float32"), ("(64, 50)", "int64")) and launch.args == ("in0", "out0", "out1")
    assert launch.grid == "(64,)" and launch.shared_mem == str(4 * 32000)  # the row's keys cached


@pytest.mark.parametrize("expr,shape,dtype,outs", [
    ("torch.topk(x, 50)", "64, 32000", "float32", ("float32", "int64")),
    ("torch.topk(x, 7, dim=-1, largest=False)[0]", "3, 5, 1001", "bfloat16", ("bfloat16",)),
    ("torch.topk(x, 1000, dim=1).indices", "4, 70000", "float32", ("int64",)),
    ("torch.topk(x, 64).values * 1", "8, 4096", "float16", None),
    ("torch.topk(x, 3)", "10", "float32", ("float32", "int64")),
])
def test_topk_shapes_are_covered_and_compile(tmp_path, expr, shape, dtype, outs):
    p = topk(tmp_path, expr, shape, dtype)
    fam = TopkRows()
    if outs is None:  # an op after the top-k: the partition's case, not this family's
        assert "not one top-k" in fam.supports(p)
        return
    assert fam.supports(p) is None, fam.supports(p)
    seeds = fam.seeds(p)
    assert seeds
    launch = fam.launch(fam.complete(seeds[0]), p)
    assert tuple(o[1] for o in launch.outputs) == outs
    assert len(launch.outputs) + len(launch.scratch) == 2
    if shape == "4, 70000":  # 280 KB of keys: no cached seed
        assert all(not c["CACHE"] for c in seeds)
    smoke_compile(fam, p, 1)


def test_topk_refusals_name_the_cause(tmp_path):
    fam = TopkRows()
    assert "not the last" in fam.supports(topk(tmp_path, "torch.topk(x, 5, dim=0)"))
    assert "unsorted" in fam.supports(topk(tmp_path, "torch.topk(x, 5, sorted=False)"))
    assert "k=2000" in fam.supports(topk(tmp_path, "torch.topk(x, 2000)"))
    assert "indices before its values" in fam.supports(topk(tmp_path, "(lambda r: (r[1], r[0]))(torch.topk(x, 5))"))
    assert "not one top-k" in fam.supports(topk(tmp_path, "torch.topk(x * 2, 5)"))
    assert "half-precision" in fam.supports(topk(tmp_path, "torch.topk(x, 5)", dtype="bfloat16"))
    assert fam.supports(topk(tmp_path, "torch.topk(x, 5).values", dtype="bfloat16")) is None  # equal values: no order to get wrong
