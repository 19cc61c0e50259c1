"""The fp16/bf16 GEMM over planes on a real GPU, judged against float64 at the bound PyTorch's own
result in that dtype sets: batched, an operand or both used transposed, K of no whole 16 bytes (KernelBench
level1/8's 2949), the traced bias and activation after it; every seed."""

import pytest

from cuforge.kernels.gemm_planes import GemmPlanesSm90
from template_helpers import check_family, problem_from_expr

pytestmark = pytest.mark.gpu

CASES = [("torch.bmm(a, b)", "torch.randn(16, 256, 96, dtype=D), torch.randn(16, 96, 200, dtype=D)"),
         ("a.T @ b", "torch.randn(300, 130, dtype=D), torch.randn(300, 72, dtype=D)"),
         ("a.T @ b.T", "torch.randn(77, 130, dtype=D), torch.randn(99, 77, dtype=D)"),
         ("a @ b.T", "torch.randn(1000, 2949, dtype=D), torch.randn(1500, 2949, dtype=D)"),
         ("torch.relu(a @ b) + 1", "torch.randn(130, 77, dtype=D), torch.randn(77, 99, dtype=D)")]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("expr, inputs", CASES, ids=[c[0] for c in CASES])
def test_half_gemm_over_planes(sup, tmp_path, dtype, expr, inputs):
    p = problem_from_expr(tmp_path, expr, inputs.replace("D", f"torch.{dtype}"), prefix="gpu")
    check_family(sup, GemmPlanesSm90(), p, n_random=0)
