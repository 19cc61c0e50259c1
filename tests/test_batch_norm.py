"""The training-mode batch norm family on the CPU: what it matches (1-D and 2-D batch norms, an
affine or none, a chain after it, the running-statistics update ignored as a side effect), what it
refuses (eval mode), its launch (statistics, coefficients, write), and NVRTC compiles of its configs;
and the convolution / GEMM heads it completes as a tail."""

import pytest

from cuforge.kernels.batch_norm import BatchNorm
from cuforge.kernels.families import families_for
from template_helpers import problem_from_expr, smoke_compile

FAM = BatchNorm()


def bn_problem(tmp_path, layer, x_shape, tail="y", train=True, dtype=None):
    init = f"        self.bn = {layer}\n" + ("" if train else "        self.eval()\n")
    if dtype:  # the input and the layer's parameters in that dtype
        init += f"        self.bn.to(torch.{dtype})\n"
        x_shape = x_shape[:-1] + f", dtype=torch.{dtype})"
    return problem_from_expr(tmp_path, f"(lambda y: {tail})(self.bn(a))", f"torch.randn{x_shape}", args="a", init=init)


def test_a_training_batch_norm_with_a_chain_is_matched(tmp_path):
    p = bn_problem(tmp_path, "nn.BatchNorm2d(16)", "(4, 16, 10, 12)", "torch.relu(y) * 2")
    assert families_for(p)[0][0].name == FAM.name
    m = FAM.matched(p)
    assert (m.n, m.c, m.span, m.eps) == (4, 16, 120, 1e-5) and m.weight and m.bias
    launch = FAM.render(FAM.seeds(p)[0], p).launch
    assert [pre[0] for pre in launch.pre] == ["batch_norm_stats", "batch_norm_coef"]
    assert launch.scratch[0] == ("(32,)", "float64", "zeros")  # per channel: sum and sum of squares


def test_eval_mode_and_no_affine(tmp_path):
    assert "eval mode" in FAM.supports(bn_problem(tmp_path, "nn.BatchNorm2d(16)", "(4, 16, 10, 12)", train=False))
    m = FAM.matched(bn_problem(tmp_path, "nn.BatchNorm1d(32, affine=False)", "(64, 32)"))
    assert (m.n, m.c, m.span, m.weight, m.bias) == (64, 32, 1, None, None)


@pytest.mark.parametrize("layer, x_shape, tail", [
    ("nn.BatchNorm2d(16)", "(4, 16, 10, 12)", "y"),
    ("nn.BatchNorm1d(24, eps=1e-3)", "(8, 24, 7)", "torch.tanh(y)"),  # a span not a multiple of 4
    ("nn.BatchNorm3d(8, affine=False)", "(2, 8, 3, 4, 5)", "y * 3"),
    ("nn.BatchNorm1d(32)", "(64, 32)", "F.gelu(y)"),
])
def test_configs_compile(tmp_path, layer, x_shape, tail):
    p = bn_problem(tmp_path, layer, x_shape, tail)
    assert FAM.supports(p) is None, FAM.supports(p)
    smoke_compile(FAM, p, 2)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_batch_norm_is_matched_and_compiles(tmp_path, dtype):
    """fp16/bf16 input and affine: 8 elements a 16-byte load where the span allows, one where not; the output
    in the input's dtype. The team variant stays fp32's."""
    from cuforge.kernels.batch_norm_team import BatchNormTeam

    p = bn_problem(tmp_path, "nn.BatchNorm2d(16)", "(4, 16, 10, 12)", "torch.relu(y) * 2", dtype=dtype)
    assert FAM.supports(p) is None, FAM.supports(p)
    assert FAM.matched(p).dtype == dtype and [c["VEC"] for c in FAM.seeds(p)] == [8, 8, 8]
    assert FAM.launch(FAM.seeds(p)[0], p).outputs == (("in0.shape", dtype),)
    assert BatchNormTeam().supports(p) is not None
    smoke_compile(FAM, p, 2)
    odd = bn_problem(tmp_path, "nn.BatchNorm1d(24, eps=1e-3)", "(8, 24, 7)", "torch.tanh(y)", dtype=dtype)
    assert [c["VEC"] for c in FAM.seeds(odd)] == [1, 1, 1]
    smoke_compile(FAM, odd, 1)


def test_a_convolution_or_gemm_then_batch_norm_is_two_kernels(tmp_path):
    init = "        self.fc = nn.Linear(64, 96)\n        self.bn = nn.BatchNorm1d(96)"
    p = problem_from_expr(tmp_path, "torch.relu(self.bn(self.fc(a) * 2))", "torch.randn(128, 64)", args="a", init=init)
    fam = families_for(p)[0][0]
    assert fam.name == "staged:gemm_tf32x3_sm90+batch_norm"
    smoke_compile(fam, p, 1)
