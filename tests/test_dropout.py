"""A training-mode dropout on the CPU: traced as one graph node (not its bernoulli decomposition), covered
only as a PyTorch call between the search's kernels (KernelBench level2/66 and 83), declined alone and
under policy 'custom', and judged ok because it draws the reference's mask after the judge's reseed."""

import pytest

from cuforge.kernels.dropout import TorchDropout
from cuforge.kernels.families import families_for
from cuforge.sandbox.protocol.candidate import TorchCall, wrap_stages
from cuforge.sandbox.protocol.evaluation import EvalConfig
from cuforge.sandbox.driver.supervisor import Supervisor
from graph_eval import assert_stages_compute_forward
from template_helpers import problem_from_expr, smoke_compile

CFG = EvalConfig(device="cpu", trials=3, min_samples=5, max_samples=10, timeout_s=60)

# KernelBench level2/66's and 83's shapes, small.
GEMM_DROPOUT_SOFTMAX = ("torch.softmax(self.drop(self.fc(a)), dim=1)", "torch.rand(16, 64)",
                        "        self.fc = nn.Linear(64, 96)\n        self.drop = nn.Dropout(0.2)")
CONV_GN_CLAMP_DROPOUT = ("self.drop(torch.clamp(torch.min(self.gn(self.conv(a)), torch.tensor(0.0)), min=0.0, max=1.0))",
                         "torch.rand(2, 3, 6, 10, 10)",
                         "        self.conv = nn.Conv3d(3, 16, 3)\n        self.gn = nn.GroupNorm(8, 16)\n"
                         "        self.drop = nn.Dropout(0.2)")


def _ops(p):
    return [n.op for n in p.graph]


def test_a_training_mode_dropout_is_one_node_with_atens_arguments(tmp_path):
    p = problem_from_expr(tmp_path, *GEMM_DROPOUT_SOFTMAX[:2], args="a", init=GEMM_DROPOUT_SOFTMAX[2])
    assert _ops(p) == ["addmm", "dropout", "_softmax_lastdim"]
    node = p.graph[1]
    assert node.args == (p.graph[0].out, 0.2, True) and node.shape == (16, 96)
    # Every spelling: the function, torch.dropout, in place; a later op reads the dropout's result.
    for expr in ("F.dropout(a * 2, 0.3) + 1", "torch.dropout(a * 2, 0.3, True) + 1", "F.dropout(a * 2, p=0.3, inplace=True) + 1"):
        q = problem_from_expr(tmp_path, expr, "torch.rand(8, 8)", args="a")
        assert _ops(q) == ["mul", "dropout", "add"], (expr, q.graph)
        assert q.graph[1].args == (q.graph[0].out, 0.3, True) and q.graph[2].args[0] == q.graph[1].out


def test_a_dropout_that_draws_nothing_leaves_no_node(tmp_path):
    for expr in ("F.dropout(a * 2, 0.3, training=False) + 1", "F.dropout(a * 2, 0.0) + 1"):
        q = problem_from_expr(tmp_path, expr, "torch.rand(8, 8)", args="a")
        assert "dropout" not in _ops(q), (expr, q.graph)
    # p = 1 zeroes everything (no draw): left as traced, and no family claims a dropout in it.
    q = problem_from_expr(tmp_path, "F.dropout(a * 2, 1.0) + 1", "torch.rand(8, 8)", args="a")
    assert "dropout" not in _ops(q)


@pytest.mark.parametrize("case, stages", [
    (GEMM_DROPOUT_SOFTMAX, ["gemm_tf32x3_sm90", "dropout_torch", "softmax_rows"]),
    (CONV_GN_CLAMP_DROPOUT, ["conv_direct", "dropout_torch"]),
])
def test_a_dropout_between_kernels_is_a_pytorch_stage_of_a_pipeline(tmp_path, case, stages):
    expr, inputs, init = case
    p = problem_from_expr(tmp_path, expr, inputs, args="a", init=init)
    fams, why = families_for(p)
    assert [f.name for f in fams] == ["pipeline"], why
    names = [s.family.name for s in fams[0].matched(p)]
    assert names[0] == stages[0] and names[-1] == stages[-1] and names.count("dropout_torch") == 1, names
    source = fams[0].render(fams[0].seeds(p)[0], p).source
    assert "_TorchStage('torch.dropout(in0, 0.2, True)')" in source
    # The cut is right (the generators reseeded before the forward and before the stages), and every kernel
    # stage compiles; the PyTorch stage has nothing to compile.
    assert_stages_compute_forward(fams[0], p)
    smoke_compile(fams[0], p, 0)


def test_a_lone_dropout_and_policy_custom_are_not_covered(tmp_path):
    lone = problem_from_expr(tmp_path, "F.dropout(a, 0.2)", "torch.rand(8, 8)", args="a")
    fams, why = families_for(lone)
    assert fams == [] and "not covered offline" in why
    custom = problem_from_expr(tmp_path, *GEMM_DROPOUT_SOFTMAX[:2], args="a", init=GEMM_DROPOUT_SOFTMAX[2],
                               cuforge='CUFORGE = {"policy": "custom"}')
    assert families_for(custom)[0] == []
    assert "policy 'custom'" in TorchDropout().supports(problem_from_expr(
        tmp_path, "F.dropout(a, 0.2)", "torch.rand(8, 8)", args="a", cuforge='CUFORGE = {"policy": "custom"}'))


def test_a_torch_call_stage_is_checked_when_made():
    with pytest.raises(SyntaxError):
        TorchCall("torch.dropout(in0,")
    src = wrap_stages([TorchCall("torch.dropout(in0, 0.5, True)")], [None])
    compile(src, "<wrapper>", "exec")
    assert "torch call 'torch.dropout(in0, 0.5, True)'" in src


def test_the_pytorch_stage_draws_the_references_mask_and_another_p_is_wrong(tmp_path):
    p = problem_from_expr(tmp_path, "F.dropout(a, 0.2)", "torch.rand(64, 256)", args="a")
    fam = TorchDropout()
    cand = fam.render({}, p)
    other = problem_from_expr(tmp_path, "F.dropout(a, 0.3)", "torch.rand(64, 256)", args="a")
    with Supervisor(cpu_mode=True) as s:
        ev = s.evaluate(p, cand, CFG)
        assert ev.status == "ok", ev.message
        ev = s.evaluate(p, fam.render({}, other), CFG)
        assert ev.status == "wrong_output", (ev.status, ev.message)
