"""The residual norm family on a real GPU, judged against float64 at the bound PyTorch's own result in
that dtype sets: the models suite's pre-norm seams (a residual add, then RMSNorm or LayerNorm, the sum
returned beside the norm, first or second) in fp32, bf16 and fp16, every seed and the knob values
between them; rows that are not whole 16-byte vectors (element-by-element accesses), a row count that
leaves a block's last rows empty, a prologue with a per-column gain and only the norm returned; LLaMA's
RMSNorm alone (the empty prologue)."""

import pytest

from cuforge.kernels.residual_norm import ResidualNorm
from cuforge.problems.suites import load_problem
from template_helpers import assert_all_ok, family_configs, problem_from_expr

pytestmark = pytest.mark.gpu
TORCH = {"float32": "torch.float32", "bfloat16": "torch.bfloat16", "float16": "torch.float16"}


@pytest.mark.parametrize("dtype", ["", "@bf16", "@fp16"])
def test_the_models_pre_norm_seams(sup, dtype):
    fam = ResidualNorm()
    for name in ("residual_rmsnorm", "vit_layernorm_residual"):
        p = load_problem(f"models/{name}{dtype}")
        assert fam.supports(p) is None, fam.supports(p)
        assert_all_ok(sup, fam, p, family_configs(fam, p, 2), what=(name, dtype))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_odd_rows_and_a_longer_prologue(sup, tmp_path, dtype):
    fam = ResidualNorm()
    t = TORCH[dtype]
    init = f"        self.norm = nn.LayerNorm(250).to({t})\n        self.g = nn.Parameter(torch.rand(250, dtype={t}))"
    odd = problem_from_expr(tmp_path, "self.norm(a * 0.5 + b * self.g)", f"torch.randn(7, 3, 250, dtype={t}), "
                            f"torch.randn(7, 3, 250, dtype={t})", init=init)
    assert_all_ok(sup, fam, odd, family_configs(fam, odd, 2), what=("odd", dtype))
    rms = ("(lambda s: (F.silu(self.w * (lambda h: h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6))"
           "(s.float()).to(s.dtype)), s))(a + b)")
    p = problem_from_expr(tmp_path, rms, f"torch.randn(5, 520, dtype={t}) * 3, torch.randn(5, 520, dtype={t})",
                          init=f"        self.w = nn.Parameter(torch.rand(520, dtype={t}))")
    assert_all_ok(sup, fam, p, family_configs(fam, p, 2), what=("rms", dtype))


@pytest.mark.parametrize("dtype", ["", "@bf16"])
def test_a_norm_alone(sup, dtype):
    fam = ResidualNorm()
    p = load_problem(f"models/llama_rmsnorm{dtype}")
    assert fam.supports(p) is None, fam.supports(p)
    assert_all_ok(sup, fam, p, fam.seeds(p), what=("llama_rmsnorm", dtype))
