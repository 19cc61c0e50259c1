"""The 3xTF32 wgmma GEMM on a real Hopper GPU against the float64 reference, at the harness's fp32
tolerance: ragged M, N and K (K not a multiple of 4: padded planes), both operand layouts, batches,
merged rows, a parameterised linear layer with its bias, row sums, a large square product; operands
split in shared memory in place (K-major) and transposed ([K, rows]), in batches whose K is ragged."""

import pytest

from cuforge.kernels.gemm_tf32 import GemmTf32x3Sm90
from template_helpers import CFG, family_configs, problem_from_expr, skip_unless_sm90

pytestmark = pytest.mark.gpu


def check(sup, p, n_random=1):
    fam = GemmTf32x3Sm90()
    skip_unless_sm90(sup, "wgmma needs sm_90a")
    assert fam.supports(p) is None, fam.supports(p)
    for c in family_configs(fam, p, n_random):
        ev = sup.evaluate(p, fam.render(c, p), CFG)
        assert ev.status == "ok", (p.graph, c, ev.status, ev.message)


@pytest.mark.parametrize("expr, inputs", [
    ("a @ b", "torch.randn(1000, 1001), torch.randn(1001, 999)"),
    ("a.T @ b", "torch.randn(203, 300), torch.randn(203, 257)"),
    ("torch.relu(torch.bmm(a, b.transpose(1, 2))) * 2", "torch.randn(3, 130, 64), torch.randn(3, 96, 64)"),
    ("torch.matmul(a, b)", "torch.randn(4, 130, 96), torch.randn(96, 200)"),
    ("torch.sum(torch.sigmoid(a @ b), dim=1, keepdim=True)", "torch.randn(100, 64), torch.randn(64, 3000)"),
    ("a @ b", "torch.randn(4096, 4096), torch.randn(4096, 4096)"),
])
def test_tf32x3_gemm(sup, tmp_path, expr, inputs):
    check(sup, problem_from_expr(tmp_path, expr, inputs))


def test_tf32x3_linear_with_bias(sup, tmp_path):
    p = problem_from_expr(tmp_path, "torch.relu(self.fc(a))", "torch.randn(512, 768)", args="a",
                          init="        self.fc = nn.Linear(768, 384)")
    check(sup, p)


def test_tf32x3_split_k_over_a_long_k(sup, tmp_path):
    p = problem_from_expr(tmp_path, "a @ b", "torch.randn(256, 65536), torch.randn(65536, 200)")
    assert GemmTf32x3Sm90().seeds(p)[0]["SPLIT_K"] > 1
    check(sup, p, n_random=0)


@pytest.mark.parametrize("expr, inputs, modes", [
    ("torch.relu(torch.bmm(a, b.transpose(1, 2))) * 2", "torch.randn(3, 130, 64), torch.randn(3, 96, 64)", (1, 1)),
    ("a @ b", "torch.randn(1000, 1024), torch.randn(1024, 999)", (1, 0)),
    ("a @ b", "torch.randn(1000, 1024), torch.randn(1024, 1000)", (1, 2)),
    ("a.T @ b", "torch.randn(200, 300), torch.randn(200, 256)", (2, 2)),  # K = 200: a ragged last k-tile
    # K = 100 in a batch: a batch's last k-tile reads the next batch's first rows, which must count as zeros.
    ("torch.bmm(a, b)", "torch.randn(3, 130, 100), torch.randn(3, 100, 96)", (1, 2)),
    ("torch.bmm(a.transpose(1, 2), b) + 1", "torch.randn(3, 100, 128), torch.randn(3, 100, 64)", (2, 2)),
])
def test_tf32x3_operands_split_in_shared_memory(sup, tmp_path, expr, inputs, modes):
    p = problem_from_expr(tmp_path, expr, inputs)
    fam = GemmTf32x3Sm90()
    skip_unless_sm90(sup, "wgmma needs sm_90a")
    for c in fam.seeds(p)[:3]:
        smem = {**c, "SPLIT": "smem"}
        if not fam.valid(smem, p):
            continue
        assert fam.modes(smem, fam.matched(p)) == modes
        ev = sup.evaluate(p, fam.render(smem, p), CFG)
        assert ev.status == "ok", (smem, ev.status, ev.message)


def test_tf32x3_split_k_with_b_transposed_in_shared_memory(sup, tmp_path):
    p = problem_from_expr(tmp_path, "a @ b", "torch.randn(256, 65536), torch.randn(65536, 200)")
    fam = GemmTf32x3Sm90()
    skip_unless_sm90(sup, "wgmma needs sm_90a")
    first = fam.seeds(p)[0]
    assert first["SPLIT"] == "smem" and first["SPLIT_K"] > 1 and fam.modes(first, fam.matched(p)) == (1, 2)
    ev = sup.evaluate(p, fam.render(first, p), CFG)
    assert ev.status == "ok", (first, ev.status, ev.message)
