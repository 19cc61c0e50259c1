"""Partitions on a real Hopper GPU against the float64 reference: kernels for the runs of ops families
cover, PyTorch between them (a flip and a sort between linear layers; KernelBench level3's ResNet basic
block, a VGG-style stack and a transformer's attention, at smaller sizes), every seed judged `ok`; LLaMA's
SwiGLU MLP in bf16 with its three products left to cuBLAS around the fused gate kernel."""

import pytest

from cuforge.kernels.families import PARTITION, families_for
from partition_cases import CASES
from template_helpers import CFG, problem_from_expr, skip_unless_sm90

pytestmark = pytest.mark.gpu
FAM = PARTITION

@pytest.mark.parametrize("expr, inputs, init", CASES)
def test_partitions_are_correct_on_the_gpu(sup, tmp_path, expr, inputs, init):
    skip_unless_sm90(sup, "most kernel parts are wgmma kernels: sm_90a")
    p = problem_from_expr(tmp_path, expr, inputs, args="a", init=init)
    assert [f.name for f in families_for(p)[0]] == ["partition"], families_for(p)
    for config in FAM.seeds(p)[:3]:
        ev = sup.evaluate(p, FAM.render(config, p), CFG)
        assert ev.status == "ok", (expr[:60], ev.status, ev.message)


def test_a_swiglu_mlp_with_its_products_in_pytorch_is_ok_and_runs_its_own_kernel(sup):
    skip_unless_sm90(sup, "the partition's other seeds are wgmma kernels: sm_90a")
    from cuforge.problems.suites import load_problem

    p = load_problem("models/swiglu_mlp@bf16")
    assert [f.name for f in families_for(p)[0]] == ["partition"], families_for(p)
    config = FAM.seeds(p)[1]
    cand = FAM.render(config, p)
    assert cand.meta["parts"].split("+").count("torch") == 3, cand.meta["parts"]
    ev = sup.evaluate(p, cand, CFG)
    assert ev.status == "ok", (ev.status, ev.message)
    assert any("pointwise" in k for k in ev.correctness.get("kernels", [])), ev.correctness.get("kernels")
