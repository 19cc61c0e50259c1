"""Partitions on a real Hopper GPU against the float64 reference: kernels for the runs of ops families
cover, PyTorch between them (a flip and a sort between linear layers; KernelBench level3's ResNet basic
block, a VGG-style stack and a transformer's attention, at smaller sizes), every seed judged `ok`."""

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
