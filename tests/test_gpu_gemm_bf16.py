"""The half-precision GEMM families in bf16 on a real GPU (the same templates as fp16, with bf16
wgmma / mma.sync operands and bf16 stores), judged against float64 at the bound PyTorch's own bf16
result sets: partial tiles, split-K in each reduction, multicast clusters, narrow tiles, both
epilogues, and the fused linear layer with its bias and activation; and, in fp16 and bf16, linear
layers without a bias and with GELU's tanh form."""

import pytest

from cuforge.kernels.gemm import GemmSm80, GemmSm90, LinearSm90
from template_helpers import CFG, half_gemm_problem, half_linear_problem

pytestmark = pytest.mark.gpu
SM90_BF16 = [dict(BM=128, BN=128, STAGES=4, GROUP_M=8, SPLIT_K=1, REDUCE="ordered", EPI="tma"),
             dict(BM=64, BN=256, STAGES=3, GROUP_M=16, SPLIT_K=2, REDUCE="atomic", EPI="tma"),
             dict(BM=64, BN=64, STAGES=4, GROUP_M=8, SPLIT_K=8, REDUCE="cluster", EPI="direct"),
             dict(BM=128, BN=64, STAGES=4, GROUP_M=8, SPLIT_K=4, REDUCE="ordered", EPI="direct"),
             dict(BM=64, BN=16, STAGES=12, GROUP_M=4, SPLIT_K=2, REDUCE="atomic", EPI="direct"),
             dict(BM=128, BN=64, STAGES=8, GROUP_M=8, SPLIT_K=1, REDUCE="ordered", EPI="tma", CLUSTER_M=2, CLUSTER_N=1),
             dict(BM=64, BN=128, STAGES=6, GROUP_M=1, SPLIT_K=1, REDUCE="ordered", EPI="direct", CLUSTER_M=1, CLUSTER_N=2),
             dict(BM=64, BN=128, STAGES=8, GROUP_M=8, SPLIT_K=1, REDUCE="ordered", EPI="tma", ONE_CONSUMER=True)]


def judge_all(sup, fam, p, configs):
    assert fam.supports(p) is None, fam.supports(p)
    for c in configs:
        ev = sup.evaluate(p, fam.render(c, p), CFG)
        assert ev.status == "ok", (p.id, c, ev.status, ev.message)


@pytest.mark.parametrize("shape", [(1000, 704, 336), (64, 64, 16384), (777, 1032, 1024), (4096, 4096, 4096)])
def test_bf16_gemm_sm90(sup, tmp_path, shape):
    g = GemmSm90()
    p = half_gemm_problem(tmp_path, *shape)
    extra = [c for c in SM90_BF16 if g.valid(c, p) and c not in g.seeds(p)]
    judge_all(sup, g, p, g.seeds(p)[:3] + (extra[:2] if shape[0] * shape[1] > 2**22 else extra))


def test_bf16_gemm_sm80(sup, tmp_path):
    g = GemmSm80()
    for shape in ((1000, 704, 336), (128, 136, 72)):
        p = half_gemm_problem(tmp_path, *shape)
        judge_all(sup, g, p, g.seeds(p)[:4])


@pytest.mark.parametrize("expr", ["self.linear(x)", "F.gelu(self.linear(x))", "F.silu(self.linear(x))"])
def test_bf16_linear_sm90(sup, tmp_path, expr):
    g = LinearSm90()
    for m, n, k in ((100, 136, 1032), (777, 520, 1024)):
        p = half_linear_problem(tmp_path, m, n, k, expr)
        judge_all(sup, g, p, g.seeds(p)[:2] + [c for c in SM90_BF16 if g.valid(c, p)][:4])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_linear_sm90_without_bias_and_with_tanh_gelu(sup, tmp_path, dtype):
    # LLaMA's projections have no bias; GPT-2's MLP uses GELU's tanh form.
    from template_helpers import problem_from_expr

    g = LinearSm90()
    half = f"dtype=torch.{dtype}"
    for expr, bias in (("self.l(x)", False), ("F.gelu(self.l(x), approximate='tanh')", True),
                       ("F.silu(self.l(x))", False)):
        for m, n, k in ((100, 136, 1032), (1, 64, 512)):
            p = problem_from_expr(tmp_path, expr, f"torch.randn({m}, {k}, {half})", "x",
                                  f"        self.l = nn.Linear({k}, {n}, bias={bias}, {half})", prefix="gpu")
            judge_all(sup, g, p, g.seeds(p)[:2] + [c for c in SM90_BF16 if g.valid(c, p)][:3])
