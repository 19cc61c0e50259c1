"""A row norm after a pointwise prologue in one kernel (kernels/residual_norm.py), on the CPU: which
graphs it takes (the pre-norm seams of the models suite in each dtype, a norm of a longer prologue, a
sum returned first or not at all), the reasons it gives for the ones it leaves, and every seed and a
few other configs rendered and compiled with NVRTC for sm_90a."""

import pytest

from cuforge.kernels.families import families_for
from cuforge.kernels.residual_norm import ResidualNorm, match_residual_norm
from cuforge.problems.suites import load_problem
from template_helpers import problem_from_expr, smoke_compile

TORCH = {"float32": "torch.float32", "bfloat16": "torch.bfloat16", "float16": "torch.float16"}


@pytest.mark.parametrize("ref, kind, sum_first", [
    ("models/residual_rmsnorm", "rmsnorm", False), ("models/residual_rmsnorm@bf16", "rmsnorm", False),
    ("models/residual_rmsnorm@fp16", "rmsnorm", False), ("models/vit_layernorm_residual", "layernorm", True),
    ("models/vit_layernorm_residual@bf16", "layernorm", True), ("models/vit_layernorm_residual@fp16", "layernorm", True)])
def test_the_models_pre_norm_seams_are_one_kernel(ref, kind, sum_first):
    p = load_problem(ref)
    fams, why = families_for(p)
    assert [f.name for f in fams] == ["residual_norm"], why[-300:]
    m = match_residual_norm(p)
    assert not isinstance(m, str)
    assert (m.norm.kind, m.stores_sum, m.sum_first, m.norm.dtype) == (kind, True, sum_first, p.outputs[0].dtype)
    # The other operand of the add is read as a 16-byte vector beside the anchor's.
    assert m.prologue is not None and [how for _, how in m.prologue.tensors] == ["rc"]
    fam = ResidualNorm()
    assert fam.seeds(p) and "pv0[e]" in fam.render(fam.seeds(p)[0], p).source
    smoke_compile(fam, p, 2)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_a_longer_prologue_odd_columns_and_no_sum_returned(tmp_path, dtype):
    t = TORCH[dtype]
    init = f"        self.norm = nn.LayerNorm(250).to({t})\n        self.g = nn.Parameter(torch.rand(250, dtype={t}))"
    # A scaled residual with a per-column gain: the gain is read per column, the rows are not whole
    # 16-byte vectors (250 columns), and only the norm is returned.
    p = problem_from_expr(tmp_path, "self.norm(a * 0.5 + b * self.g)", f"torch.randn(7, 3, 250, dtype={t}), "
                          f"torch.randn(7, 3, 250, dtype={t})", init=init)
    m = match_residual_norm(p)
    assert not isinstance(m, str), m
    assert not m.stores_sum and m.norm.rows == 21 and m.norm.cols == 250
    assert sorted(how for _, how in m.prologue.tensors) == ["c", "rc"]
    smoke_compile(ResidualNorm(), p, 3)


def test_an_rmsnorm_with_its_epilogue_after_a_residual_add(tmp_path):
    # LLaMA's norm (cast, statistics in fp32, cast back, weight) of the residual sum, then a SiLU gate:
    # the returned sum comes second.
    expr = ("(lambda s: (F.silu(self.w * (lambda h: h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6))"
            "(s.float()).to(s.dtype)), s))(a + b)")
    p = problem_from_expr(tmp_path, expr, "torch.randn(5, 520, dtype=torch.bfloat16), torch.randn(5, 520, dtype=torch.bfloat16)",
                          init="        self.w = nn.Parameter(torch.rand(520, dtype=torch.bfloat16))")
    m = match_residual_norm(p)
    assert not isinstance(m, str), m
    assert m.norm.kind == "rmsnorm" and m.stores_sum and not m.sum_first and m.norm.eps == 1e-6
    smoke_compile(ResidualNorm(), p, 2)


def test_graphs_it_leaves_say_why(tmp_path):
    # A norm alone: taken with an empty prologue, after norm_rows.
    plain = problem_from_expr(tmp_path, "F.layer_norm(a, (64,))", "torch.randn(8, 64)", args="a")
    m = match_residual_norm(plain)
    assert not isinstance(m, str) and m.prologue.body == "" and m.anchor == "in0" and not m.stores_sum
    names = [f.name for f in families_for(plain)[0]]
    assert names[0] == "norm_rows" and "residual_norm" in names
    smoke_compile(ResidualNorm(), plain, 1)
    assert match_residual_norm(problem_from_expr(tmp_path, "torch.cumsum(a, 1)", "torch.randn(8, 64)", args="a")).startswith(
        "neither a norm nor a pointwise prologue and a norm")
    # The prologue's value read after the norm by something other than the forward's return.
    reread = problem_from_expr(tmp_path, "(lambda s: F.layer_norm(s, (64,)) * s)(a + b)", "torch.randn(8, 64), torch.randn(8, 64)")
    assert isinstance(match_residual_norm(reread), str)
    # A norm over a dim other than the last.
    other = problem_from_expr(tmp_path, "F.normalize(a + b, dim=0)", "torch.randn(8, 64), torch.randn(8, 64)")
    assert isinstance(match_residual_norm(other), str)


def test_configs_keep_every_thread_of_a_row_busy_and_within_its_registers():
    fam = ResidualNorm()
    p = load_problem("models/vit_layernorm_residual@fp16")  # 768 fp16 columns: 96 vectors of 16 bytes
    assert fam.valid(dict(TPR=96, RPB=2), p) and fam.valid(dict(TPR=32, RPB=8), p)
    assert not fam.valid(dict(TPR=128, RPB=1), p)  # more threads than vectors
    assert not fam.valid(dict(TPR=512, RPB=4), p)  # more than 1024 threads a block
    long_rows = load_problem("models/residual_rmsnorm")  # 4096 fp32 columns: 1024 vectors
    assert not fam.valid(dict(TPR=32, RPB=1), long_rows)  # 32 vectors (128 values) a thread: too many registers
    assert fam.valid(dict(TPR=64, RPB=1), long_rows)
