"""The softmax families on a real GPU, against the float64 reference: rows a warp or a block holds in
registers and rows it must re-read, misaligned rows, fp16 and fp32, the fused scale / causal mask /
bias / epilogue chains; the GEMM + softmax kernel on tiles that do not divide M or N, K padded to 16,
both B layouts, 2-D and batched, log-softmax."""

import pytest

from cuforge.kernels.gemm_softmax import GemmSoftmax
from cuforge.kernels.softmax import SoftmaxRows
from cuforge.problems.suites import load_problem
from template_helpers import CFG, family_configs, problem_from_expr

pytestmark = pytest.mark.gpu
H16 = "dtype=torch.float16"


def check(sup, fam, p, n_random=3):
    assert fam.supports(p) is None, fam.supports(p)
    for c in family_configs(fam, p, n_random):
        ev = sup.evaluate(p, fam.render(c, p), CFG)
        assert ev.status == "ok", (p.graph, c, ev.status, ev.message)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", [(7, 1), (33, 1000), (5, 4099), (64, 8192), (3, 50, 520)])
def test_softmax_rows_plain_and_log(sup, tmp_path, dtype, shape):
    dims = ", ".join(map(str, shape))
    for fn in ("softmax", "log_softmax"):
        p = problem_from_expr(tmp_path, f"torch.{fn}(a * 3.0, dim=-1)", f"torch.randn({dims}, dtype=torch.{dtype}), torch.randn(1)")
        check(sup, SoftmaxRows(), p)


@pytest.mark.parametrize("batch, m, n, k, bt", [(3, 40, 56, 16, True), (2, 100, 200, 40, True), (1, 1, 8, 8, True),
                                                (4, 130, 1024, 128, True), (2, 77, 264, 64, False), (0, 70, 136, 24, True),
                                                (0, 33, 520, 256, False)])
def test_gemm_softmax_on_awkward_shapes(sup, tmp_path, batch, m, n, k, bt):
    lead = f"{batch}, " if batch else ""
    b_shape = f"{lead}{n}, {k}" if bt else f"{lead}{k}, {n}"
    b_expr = ("b.transpose(-1, -2)" if bt else "b")
    gemm = f"torch.bmm(a, {b_expr})" if batch else f"a @ {b_expr}"
    p = problem_from_expr(tmp_path, f"torch.softmax({gemm} * 0.125, dim=-1)",
                          f"torch.randn({lead}{m}, {k}, {H16}), torch.randn({b_shape}, {H16})")
    check(sup, GemmSoftmax(), p, n_random=2)


@pytest.mark.parametrize("fam, expr, inputs, builtin", [
    (SoftmaxRows(), "torch.softmax((a * 0.5).masked_fill(~torch.ones(70, 70, dtype=torch.bool, device=a.device).tril(), "
                    "float('-inf')) + b, -1) * b", f"torch.randn(3, 70, 70, {H16}), torch.randn(70, {H16})",
     "level2/masked_scaled_softmax"),
    (GemmSoftmax(), "torch.log_softmax((a @ b.transpose(1, 2)).masked_fill(torch.ones(96, 96, device=a.device).triu(1)"
                    ".bool(), float('-inf')), -1)", f"torch.randn(2, 96, 32, {H16}), torch.randn(2, 96, 32, {H16})",
     "level2/matmul_softmax"),
], ids=["softmax_rows", "gemm_softmax"])
def test_causal_masks_chains_and_the_builtins(sup, tmp_path, fam, expr, inputs, builtin):
    """A causal mask from tril/triu of ones (negated or converted), a bias before the softmax and a
    product after it; then the built-in level2 problem at full size."""
    check(sup, fam, problem_from_expr(tmp_path, expr, inputs), n_random=3)
    check(sup, fam, load_problem(builtin), n_random=1)


@pytest.mark.parametrize("expr, inputs", [
    ("torch.softmax(a, dim=1)", "torch.randn(16, 64, 8, 30, 30)"),
    ("F.log_softmax(a, dim=1)", "torch.randn(5, 33, 17, 19)"),
    ("torch.sigmoid((torch.softmax(a, dim=1) + b) * 2.0)", "torch.randn(8, 96, 31, 33), torch.randn(96, 1, 1)"),
    ("torch.softmax(a, dim=-2) * b", "torch.randn(7, 300, 100), torch.randn(100)"),
    # Whole columns of -inf (torch gives NaN) and columns with some -inf or a NaN.
    ("torch.softmax(a, dim=1)", "torch.where(torch.rand(4, 40, 1, 50) < 0.3, -torch.inf, torch.randn(4, 40, 1, 50)).expand(4, 40, 2, 50).clone()"),
    ("F.log_softmax(a, dim=0)", "torch.where(torch.rand(300, 64) < 0.002, torch.nan, torch.randn(300, 64))"),
])
def test_softmax_over_a_middle_dim(sup, tmp_path, expr, inputs):
    from cuforge.kernels.softmax_dim import SoftmaxDim

    check(sup, SoftmaxDim(), problem_from_expr(tmp_path, expr, inputs, args="a, b" if "b" in expr else "a"))


@pytest.mark.parametrize("shape", [(2, 6, 5, 7, 9), (2, 6, 16, 64, 128)])
def test_softmax_over_dims_a_view_merged_with_per_channel_and_per_width_operands(sup, tmp_path, shape):
    # KernelBench level2/38's spatial softmax: softmax_rows for short rows, rows_cluster for long ones.
    from cuforge.kernels.families import family_for
    from test_softmax_families import MERGED

    init = MERGED[1].replace("randn(9)", f"randn({shape[-1]})")
    p = problem_from_expr(tmp_path, MERGED[0].replace("(2, 6, 5, 7, 9)", str(shape)), f"torch.randn{shape}", args="a", init=init)
    check(sup, family_for(p)[0], p, n_random=1)


GPT2 = ("torch.softmax((q @ k.transpose(-2, -1) / 8.0).masked_fill(~self.mask, float('-inf')), dim=-1) @ v")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_a_causal_mask_the_model_holds_fuses_into_the_scores_kernels(sup, tmp_path, dtype):
    """GPT-2's attention written out, its causal mask a bool buffer: the scale and the mask in the
    scores GEMM's epilogue or the softmax's prologue (fp16: one GEMM + softmax kernel), every part
    judged; then the models suite's problem at its full size."""
    from cuforge.kernels.families import families_for
    from template_helpers import assert_all_ok

    init = "        self.register_buffer('mask', torch.tril(torch.ones(200, 200, dtype=torch.bool)), persistent=False)"
    x = f"torch.randn(2, 3, 200, 64, dtype=torch.{dtype})"
    p = problem_from_expr(tmp_path, GPT2, f"{x}, {x}, {x}", args="q, k, v", init=init, prefix="gpu")
    fam = families_for(p)[0][0]
    source = fam.render(fam.seeds(p)[0], p).source
    assert "masked_fill" not in source and "bitwise_not" not in source, fam.name  # no PyTorch pass over the scores
    assert_all_ok(sup, fam, p, fam.seeds(p)[:3], what=(dtype,))
    suffix = {"float32": "", "float16": "@fp16", "bfloat16": "@bf16"}[dtype]
    full = load_problem(f"models/gpt2_attention{suffix}")
    fam = families_for(full)[0][0]
    assert_all_ok(sup, fam, full, fam.seeds(full)[:1], what=(dtype,))
