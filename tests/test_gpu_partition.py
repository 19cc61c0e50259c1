"""Partitions on a real Hopper GPU against the float64 reference: kernels for the runs of ops families
cover, PyTorch between them (a flip and a sort between linear layers; KernelBench level3's ResNet basic
block, a VGG-style stack and a transformer's attention, at smaller sizes), every seed judged `ok`; LLaMA's
SwiGLU MLP in bf16 with its three products left to cuBLAS around the fused gate kernel; cuDNN's
convolution with the ops after it fused (partition:library), under PyTorch's defaults and in fp16 and bf16."""

import pytest

from cuforge.kernels.families import LIBRARY_AROUND, PARTITION, families_for
from partition_cases import CASES
from template_helpers import CFG, TF32_DEFAULT, problem_from_expr, skip_unless_sm90

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


LIBRARY_CASES = [
    # KernelBench level2's shape of problem: a convolution, then a bias, an activation and a scale
    ("torch.sigmoid(self.conv(a) + self.bias) * 2.0", "torch.randn(8, 16, 64, 64)",
     "        self.conv = nn.Conv2d(16, 32, 3, padding=1)\n        self.bias = nn.Parameter(torch.randn(32, 1, 1))"),
    # in fp16: cuDNN's half convolution, an activation and a scale after it
    ("torch.tanh(self.conv(a)) * 0.5 + 1.0", "torch.randn(8, 32, 32, 32, dtype=torch.float16)",
     "        self.conv = nn.Conv2d(32, 64, 3, padding=1).half()"),
    # in bf16: the same, with a bias the tail adds
    ("torch.tanh(self.conv(a) + self.bias) * 0.5", "torch.randn(8, 32, 32, 32, dtype=torch.bfloat16)",
     "        self.conv = nn.Conv2d(32, 64, 3, padding=1).bfloat16()\n"
     "        self.bias = nn.Parameter(torch.randn(64, 1, 1).bfloat16())"),
]


@pytest.mark.parametrize("expr, inputs, init", LIBRARY_CASES, ids=["tf32", "fp16", "bf16"])
def test_the_library_s_convolution_with_its_tail_fused_is_ok_and_runs_its_own_kernel(sup, tmp_path, expr, inputs, init):
    p = problem_from_expr(tmp_path, expr, inputs, args="a", init=init).under("pytorch")
    assert [f.name for f in families_for(p)[0]][1] == LIBRARY_AROUND.name, families_for(p)
    for config in LIBRARY_AROUND.seeds(p)[:2]:
        cand = LIBRARY_AROUND.render(config, p)
        assert cand.meta["parts"].startswith("torch+"), cand.meta["parts"]
        ev = sup.evaluate(p, cand, TF32_DEFAULT)
        assert ev.status == "ok", (expr[:40], ev.status, ev.message)
        assert ev.correctness.get("kernels"), ev.correctness  # its own kernel ran beside cuDNN's


@pytest.mark.parametrize("name", ["models/resnet_bottleneck", "models/mobilenetv2_inverted_residual"])
def test_a_cnn_block_s_convolutions_by_cudnn_with_the_rest_fused_are_ok(sup, name):
    from cuforge.problems.suites import load_problem

    p = load_problem(name).under("pytorch")
    assert [f.name for f in families_for(p)[0]] == ["pipeline", LIBRARY_AROUND.name], families_for(p)
    cand = LIBRARY_AROUND.render(LIBRARY_AROUND.seeds(p)[0], p)
    ev = sup.evaluate(p, cand, TF32_DEFAULT)
    assert ev.status == "ok", (name, cand.meta["parts"], ev.status, ev.message)
