"""Two-kernel candidates on a real Hopper GPU against the float64 reference: a convolution or GEMM
head with its chain, then a group norm, a pooling, a reduction over channels or a softmax; and a
norm op with an elementwise chain fused into its write pass."""

import pytest

from cuforge.kernels.families import families_for
from cuforge.kernels.normalize import Normalize
from cuforge.kernels.staged import Staged
from test_pipeline import PIPELINE_CASES
from template_helpers import CFG, problem_from_expr, skip_unless_sm90

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("expr, inputs, init, tail", [
    ("self.gn(torch.relu(self.conv(a)) * 2)", "torch.randn(2, 8, 20, 20)",
     "        self.conv = nn.Conv2d(8, 32, 3)\n        self.gn = nn.GroupNorm(4, 32)", "normalize"),
    ("F.max_pool2d(torch.tanh(self.conv(a)), 2)", "torch.randn(3, 16, 21, 22)", "        self.conv = nn.Conv2d(16, 24, 3, padding=1)", "pool"),
    ("torch.min(self.conv(a) * 2, dim=1, keepdim=True)[0]", "torch.randn(2, 5, 30, 31)", "        self.conv = nn.Conv2d(5, 40, 3)", "reduce_dim"),
    # The reduction's chain in the tail kernel (KernelBench level2/25), and a global average pool after a
    # grouped convolution (conv_direct's, which leaves the pool to a tail kernel: the last dims reduced a row
    # a block, then squeezed; the implicit GEMM sums it in its epilogue, test_gpu_conv_pool.py).
    ("torch.tanh(torch.tanh(torch.min(self.conv(a), dim=1, keepdim=True)[0]))", "torch.randn(2, 5, 30, 31)",
     "        self.conv = nn.Conv2d(5, 40, 3)", "reduce_dim"),
    ("torch.mean(F.gelu(self.conv(a)), dim=[2, 3], keepdim=True).squeeze(-1).squeeze(-1)", "torch.randn(3, 8, 33, 35)",
     "        self.conv = nn.Conv2d(8, 24, 3, groups=4)", "reduce_dim"),
    ("(lambda m: F.gelu(m - m.mean(dim=1, keepdim=True)))(torch.max(self.fc(a), dim=1, keepdim=True).values)", "torch.randn(128, 256)",
     "        self.fc = nn.Linear(256, 1000)", "reduce_dim"),
    # Softmax over the channels, then a per-channel bias, a scale and a sigmoid (KernelBench level2/91).
    ("torch.sigmoid((torch.softmax(self.conv(a), dim=1) + self.b) * 2.0)", "torch.randn(2, 8, 20, 21)",
     "        self.conv = nn.ConvTranspose2d(8, 64, 3, stride=2)\n        self.b = nn.Parameter(torch.randn(64, 1, 1))", "softmax_dim"),
    ("torch.softmax(F.gelu(self.fc(a)), dim=1)", "torch.randn(128, 256)", "        self.fc = nn.Linear(256, 1000)", "softmax_rows"),
    ("F.hardtanh(self.gn(self.fc(a)), -1, 1)", "torch.randn(256, 512)", "        self.fc = nn.Linear(512, 384)\n        self.gn = nn.GroupNorm(8, 384)",
     "normalize"),
])
def test_a_head_kernel_then_a_tail_kernel(sup, tmp_path, expr, inputs, init, tail):
    skip_unless_sm90(sup, "the heads are wgmma kernels: sm_90a")
    p = problem_from_expr(tmp_path, expr, inputs, args="a", init=init)
    fam = families_for(p)[0][0]
    assert isinstance(fam, Staged) and fam.tail.name == tail, fam.name
    for c in fam.seeds(p)[:2]:
        ev = sup.evaluate(p, fam.render(c, p), CFG)
        assert ev.status == "ok", (fam.name, c, ev.status, ev.message)


@pytest.mark.parametrize("expr, init", [
    ("F.hardtanh(self.gn(a), -0.5, 0.5)", "        self.gn = nn.GroupNorm(8, 64)"),
    ("(lambda y: y * torch.sigmoid(y) * self.w)(self.gn(a))", "        self.gn = nn.GroupNorm(8, 64)\n        self.w = nn.Parameter(torch.randn(64))"),
    ("F.gelu(self.ln(a)) * 2.0 + a", "        self.ln = nn.LayerNorm(64)"),
])
def test_a_norm_then_its_elementwise_chain(sup, tmp_path, expr, init):
    p = problem_from_expr(tmp_path, expr, "torch.randn(300, 64)", args="a", init=init)
    fam = Normalize()
    assert fam.supports(p) is None, fam.supports(p)
    for c in fam.seeds(p):
        ev = sup.evaluate(p, fam.render(c, p), CFG)
        assert ev.status == "ok", (c, ev.status, ev.message)


@pytest.mark.parametrize("expr, inputs, init", PIPELINE_CASES)
def test_three_or_four_kernels_in_a_row(sup, tmp_path, expr, inputs, init):
    skip_unless_sm90(sup, "the heads are wgmma kernels: sm_90a")
    p = problem_from_expr(tmp_path, expr, inputs, args="a", init=init)
    fam = families_for(p)[0][0]
    assert fam.name == "pipeline", [f.name for f in families_for(p)[0]]
    for c in fam.seeds(p)[:2]:
        ev = sup.evaluate(p, fam.render(c, p), CFG)
        assert ev.status == "ok", (fam.name, c, ev.status, ev.message)


def test_a_gemm_then_an_instance_norm_of_its_rows_with_a_residual(sup, tmp_path):
    # KernelBench level2/28's shape: the chain after the norm reads the forward's second input.
    from test_staged import GEMM_ROW_INSTANCE_NORM

    skip_unless_sm90(sup, "the head is a wgmma kernel: sm_90a")
    expr, inputs, init = GEMM_ROW_INSTANCE_NORM
    p = problem_from_expr(tmp_path, expr, inputs, init=init)
    fam = families_for(p)[0][0]
    assert fam.name == "staged:gemm_tf32x3_sm90+normalize"
    for c in fam.seeds(p)[:2]:
        ev = sup.evaluate(p, fam.render(c, p), CFG)
        assert ev.status == "ok", (fam.name, c, ev.status, ev.message)
