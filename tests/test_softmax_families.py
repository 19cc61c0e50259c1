"""The softmax families on the CPU: what they read off a traced forward (the prologue before the
softmax - scale, causal mask from triu/tril of ones - the epilogue after it, the GEMM in front of
it), what they refuse and why, and their configs compiling with NVRTC."""

import pytest

from cuforge.kernels.chains import structural_mask
from cuforge.kernels.families import family_for
from cuforge.kernels.gemm_softmax import GemmSoftmax, match_gemm_softmax
from cuforge.kernels.softmax import SoftmaxRows, match_softmax
from cuforge.problems.suites import load_problem
from template_helpers import problem_from_expr, smoke_compile

H16 = "dtype=torch.float16"


def test_builtin_softmax_problems_match():
    masked = match_softmax(load_problem("level2/masked_scaled_softmax"))
    assert (masked.x, masked.in_dtype, masked.out_dtype, masked.log) == ("in0", "float16", "float16", False)
    assert masked.rows == 128 * 16 * 512 and masked.cols == 512
    # x * 0.125, then -inf where triu(ones, 1) holds: column - row >= 1, the row taken within the mask
    assert "v * 0.125f" in masked.prologue.body and "c - (int)(r % 512) >= 1" in masked.prologue.body
    assert masked.prologue.tensors == () and masked.epilogue.body == ""
    assert match_softmax(load_problem("level1/log_softmax")).log
    for name, fam in (("level1/softmax", "softmax_rows"), ("level1/log_softmax", "softmax_rows"),
                      ("level2/masked_scaled_softmax", "softmax_rows"), ("level2/matmul_softmax", "gemm_softmax")):
        assert family_for(load_problem(name))[0].name == fam, name
    scores = match_gemm_softmax(load_problem("level2/matmul_softmax"))
    assert (scores.a, scores.b, scores.b_transposed, scores.batch, scores.m, scores.n, scores.k) == \
        ("in0", "in1", True, 128, 1024, 1024, 128)
    assert "v * 0.08838834764831845f" in scores.prologue.body


def test_masks_chains_and_layouts(tmp_path):
    tril = problem_from_expr(
        tmp_path, "torch.softmax(a.masked_fill(~torch.tril(torch.ones(6, 8, dtype=torch.bool, device=a.device)), -1e4) + b, -1) * b",
        f"torch.randn(2, 6, 8, {H16}), torch.randn(8, {H16})")
    f = match_softmax(tril)
    assert "!(c - (int)(r % 6) <= 0)" in f.prologue.body and "-10000.0f" in f.prologue.body
    assert f.prologue.tensors == (("in1", "c"),) and f.prologue.prefix == "p" and f.prologue.ctype == "__half"
    assert f.epilogue.tensors == (("in1", "c"),) and "__half2float(e0[c])" in f.epilogue.body
    plain = problem_from_expr(tmp_path, "torch.softmax(a @ b, dim=-1)",
                              f"torch.randn(40, 32, {H16}), torch.randn(32, 72, {H16})")
    g = match_gemm_softmax(plain)
    assert (g.b_transposed, g.batch, g.m, g.n, g.k) == (False, 1, 40, 72, 32)
    causal = problem_from_expr(
        tmp_path, "torch.log_softmax((a @ b.transpose(1, 2)).masked_fill(torch.ones(24, 24, device=a.device).triu(1).bool(), "
                  "float('-inf')), -1)", f"torch.randn(2, 24, 16, {H16}), torch.randn(2, 24, 16, {H16})")
    c = match_gemm_softmax(causal)
    assert c.log and c.b_transposed and "c - (int)(r % 24) >= 1" in c.prologue.body


@pytest.mark.parametrize("negate", [True, False])
def test_a_mask_the_model_holds_or_is_given_fuses_into_the_softmax(tmp_path, negate):
    """GPT-2's attention: scores / 8, masked_fill(~self.mask, -inf) with the causal mask a bool buffer
    broadcast over batch and heads, then softmax: one kernel reading the buffer as bool (the negation
    costs nothing); and a bool mask given as an input."""
    init = "        self.register_buffer('mask', torch.tril(torch.ones(24, 24, dtype=torch.bool)), persistent=False)"
    mask = "~self.mask" if negate else "self.mask"
    p = problem_from_expr(tmp_path, f"torch.softmax((a / 8.0).masked_fill({mask}, float('-inf')), dim=-1)",
                          f"torch.randn(2, 3, 24, 24, {H16})", args="a", init=init)
    fam = SoftmaxRows()
    assert fam.supports(p) is None, fam.supports(p)
    pro = match_softmax(p).prologue
    assert pro.masks == frozenset({0}) and pro.launch_args() == ("param0",) and "const bool* __restrict__ p0" in pro.params()
    assert ("!p0[" in pro.body) == negate and "% 576LL" in pro.body  # the (24, 24) mask under (2, 3) rows
    smoke_compile(fam, p, 1)
    given = problem_from_expr(tmp_path, "torch.softmax(a.masked_fill(b, 0.0), -1)", "torch.randn(8, 8), torch.rand(8, 8) > 0.5")
    assert fam.supports(given) is None and match_softmax(given).prologue.masks == frozenset({0})
    # The fp32 prologue's body run on the CPU: the mask read where it broadcasts, negated or not.
    import torch

    from template_helpers import chain_on_host

    p32 = problem_from_expr(tmp_path, f"torch.softmax((a / 8.0).masked_fill({mask}, float('-inf')), dim=-1)",
                            "torch.randn(2, 3, 24, 24)", args="a", init=init)
    scores, causal = torch.randn(2, 3, 24, 24), torch.tril(torch.ones(24, 24, dtype=torch.bool))
    got = chain_on_host(tmp_path, match_softmax(p32).prologue, scores, [causal])
    assert torch.equal(got, (scores / 8.0).masked_fill(~causal if negate else causal, float("-inf")))


@pytest.mark.parametrize("expr, inputs, why", [
    ("torch.softmax(a, dim=0)", "torch.randn(8, 8), torch.randn(1)", "not one softmax"),
    ("torch.softmax(a.masked_fill(b > 0.5, 0.0), -1)", "torch.randn(8, 8), torch.rand(8, 8)", "gt after the anchor"),
    ("torch.softmax(a.masked_fill(b, 0.0), -1) + b", "torch.randn(8, 8), torch.rand(8, 8) > 0.5",
     "reads in1 of dtype bool"),
    ("torch.softmax(a.masked_fill(torch.arange(8, device=a.device)[None, :] > torch.arange(8, device=a.device)[:, None], 0.0), -1)",
     "torch.randn(8, 8), torch.randn(1)", "not from triu/tril"),
    ("torch.softmax(a.masked_fill(torch.ones(1, 8, dtype=torch.bool, device=a.device).triu(), 0.0), -1)", "torch.randn(8, 8), torch.randn(1)",
     "does not cover the last two dims"),
    ("torch.softmax(a.double(), -1)", "torch.randn(8, 8), torch.randn(1)", "_to_copy after the anchor is not an elementwise"),
])
def test_softmax_refusals_name_the_cause(tmp_path, expr, inputs, why):
    p = problem_from_expr(tmp_path, expr, inputs)
    assert why in (SoftmaxRows().supports(p) or ""), SoftmaxRows().supports(p)


@pytest.mark.parametrize("expr, inputs, why", [
    ("torch.softmax(a @ b, -1)", "torch.randn(16, 16), torch.randn(16, 16)", "not fp16"),
    ("torch.softmax(a @ b, -1)", f"torch.randn(16, 12, {H16}), torch.randn(12, 16, {H16})", "multiples of 8"),
    ("torch.softmax(a @ b, -1)", f"torch.randn(16, 512, {H16}), torch.randn(512, 16, {H16})", "K <= 256"),
    ("torch.softmax(torch.bmm(a, b), -1)", f"torch.randn(70000, 8, 8, {H16}), torch.randn(70000, 8, 8, {H16})",
     "65535 batches"),
    ("torch.softmax(a.T @ b, -1)", f"torch.randn(16, 16, {H16}), torch.randn(16, 16, {H16})", "not be transposed"),
    ("torch.softmax(a @ b, -1) + torch.softmax(b, -1)", f"torch.randn(16, 16, {H16}), torch.randn(16, 16, {H16})",
     "not one softmax over the last dim after the GEMM"),
    ("torch.softmax((a @ b).sum(-1, keepdim=True) + a, -1)", f"torch.randn(16, 16, {H16}), torch.randn(16, 16, {H16})",
     "between the GEMM and the softmax"),
])
def test_gemm_softmax_refusals_name_the_cause(tmp_path, expr, inputs, why):
    p = problem_from_expr(tmp_path, expr, inputs)
    assert why in (GemmSoftmax().supports(p) or ""), GemmSoftmax().supports(p)


def test_structural_mask_rejects_non_constant_diagonals(tmp_path):
    p = problem_from_expr(tmp_path, "a.masked_fill(torch.ones(8, 8, device=a.device).triu(1).bool(), 0.0)", "torch.randn(8, 8), torch.randn(1)")
    mask = next(n for n in p.graph if n.op == "masked_fill").args[1]
    assert structural_mask(p, mask) == (8, 8, "c - {i} >= 1")
    assert "not made inside" in structural_mask(p, "in1")


@pytest.mark.parametrize("problem_ref", ["level2/masked_scaled_softmax", "level1/softmax", "level2/matmul_softmax"])
def test_softmax_configs_compile_with_nvrtc(problem_ref):
    p = load_problem(problem_ref)
    fam = family_for(p)[0]
    smoke_compile(fam, p, 3)


def test_softmax_constraints():
    fam, p = SoftmaxRows(), load_problem("level2/masked_scaled_softmax")
    assert fam.valid(dict(GROUP="warp", BLOCK=128, VEC=8, ITEMS=8), p)
    assert not fam.valid(dict(GROUP="warp", BLOCK=128, VEC=8, ITEMS=16), p)  # 128 floats of registers
    f32 = load_problem("level1/softmax")
    assert not fam.valid(dict(GROUP="block", BLOCK=256, VEC=8, ITEMS=1), f32)  # 32 bytes is not one vector
    seeds = fam.seeds(p)
    assert seeds[0]["GROUP"] == "warp" and seeds[0]["ITEMS"] * seeds[0]["VEC"] * 32 >= 512  # a row in registers
    gs, scores = GemmSoftmax(), load_problem("level2/matmul_softmax")
    assert gs.smem_bytes(dict(WARPS=4, MW=2, BN=64, STAGES=3), 128, True) == 2 * (128 * 136 + 3 * 64 * 136)
    assert not gs.valid(dict(WARPS=4, MW=2, BN=128, STAGES=2), scores)  # 128 accumulators per thread
    assert all(gs.valid(c, scores) for c in gs.seeds(scores))


@pytest.mark.parametrize("expr, inputs, log, outer, reduced, inner, operand", [
    ("torch.softmax(a, dim=1)", "torch.randn(4, 16, 6, 7)", False, 4, 16, 42, None),
    ("torch.sigmoid(torch.softmax(a, dim=1) + b) * 2", "torch.randn(4, 16, 6, 7), torch.randn(16, 1, 1)", False, 4, 16, 42, "b16x1x1"),
    ("F.log_softmax(a, dim=-2)", "torch.randn(3, 50, 20)", True, 3, 50, 20, None),
    ("torch.softmax(a, dim=0) * b", "torch.randn(30, 40), torch.randn(40)", False, 1, 30, 40, "c"),
    ("torch.softmax(a, dim=1) * b", "torch.randn(3, 30, 40), torch.randn(40)", False, 3, 30, 40, "c"),
])
def test_softmax_over_a_middle_dim_matches_and_compiles(tmp_path, expr, inputs, log, outer, reduced, inner, operand):
    # A per-channel operand (a (C, 1, 1) bias) is read at the index its broadcast gives; a per-column one
    # at the column.
    from cuforge.kernels.softmax_dim import SoftmaxDim, match_dim_softmax

    p = problem_from_expr(tmp_path, expr, inputs, args="a, b" if "b" in expr else "a")
    m = match_dim_softmax(p)
    assert not isinstance(m, str), m
    assert (m.log, m.outer, m.reduced, m.inner) == (log, outer, reduced, inner)
    assert m.cols == p.inputs[0].shape[-1] and [kind for _, kind in m.chain.tensors] == ([operand] if operand else [])
    assert family_for(p)[0].name == "softmax_dim"
    smoke_compile(SoftmaxDim(), p, 2)


@pytest.mark.parametrize("expr, inputs, why", [
    ("torch.softmax(a, dim=-1)", "torch.randn(4, 16)", "not a softmax or log-softmax over a dim other than the last"),
    ("torch.softmax(a, dim=1)", "torch.randn(4, 16, 3)", "over the last dim (or nearly)"),
    ("torch.softmax(a, dim=1).sum()", "torch.randn(4, 16, 30)", "after the softmax"),
    ("torch.softmax(a * 2, dim=1)", "torch.randn(4, 16, 30)", "not a softmax"),
])
def test_softmax_over_a_middle_dim_refusals(tmp_path, expr, inputs, why):
    from cuforge.kernels.softmax_dim import match_dim_softmax

    found = match_dim_softmax(problem_from_expr(tmp_path, expr, inputs, args="a"))
    assert isinstance(found, str) and why in found, found


# A softmax over the spatial dims of (N, C, D, H, W), written as KernelBench level2/38 writes it: the dims
# merged by a view, the softmax over the merged one, the result viewed back, then per-channel and
# per-width operands (indexed from the flat index: the kernel's rows are (n, c) pairs, not rows of W).
MERGED = ("(torch.softmax(a.view(2, 6, -1), dim=2).view(2, 6, 5, 7, 9) * self.s + self.w)",
          "        self.s = nn.Parameter(torch.randn(1, 6, 1, 1, 1))\n        self.w = nn.Parameter(torch.randn(9))")


@pytest.mark.parametrize("shape, family", [((2, 6, 5, 7, 9), "softmax_rows"), ((2, 6, 16, 64, 128), "rows_cluster")])
def test_softmax_over_dims_a_view_merged(tmp_path, shape, family):
    expr = MERGED[0].replace("(2, 6, 5, 7, 9)", str(shape))
    init = MERGED[1].replace("randn(9)", f"randn({shape[-1]})")
    p = problem_from_expr(tmp_path, expr, f"torch.randn{shape}", args="a", init=init)
    f = match_softmax(p)
    assert (f.x, f.rows, f.cols) == ("in0", 12, shape[2] * shape[3] * shape[4])
    assert f.cols_binding() == "in0.shape[2] * in0.shape[3] * in0.shape[4]"
    assert f.prologue.body == ""
    # both operands indexed by broadcasting from the flat index, neither as a per-row or per-column one
    assert [kind for _, kind in f.epilogue.tensors] == ["b1x6x1x1x1", f"b{shape[-1]}"]
    fam, _ = family_for(p)
    assert fam.name == family
    smoke_compile(fam, p, 1)


@pytest.mark.parametrize("expr, why", [
    ("torch.softmax(a.view(2, 6, -1), dim=2)", "change the shape"),  # not viewed back: the output is the view
    ("torch.softmax(a.view(2, 6, -1), dim=2).view(2, 6, 5, 7, 9).triu()", "triu over merged dims"),
])
def test_softmax_over_merged_dims_refusals(tmp_path, expr, why):
    p = problem_from_expr(tmp_path, expr, "torch.randn(2, 6, 5, 7, 9)", args="a")
    assert why in str(match_softmax(p))


def test_gpt2s_scores_fuse_and_a_kernel_s_output_keeps_its_own_shape():
    """GPT-2's attention in fp16: the scores GEMM, its [B, H, S, S] view, the scale, ~mask and the
    softmax are one gemm_softmax kernel (a run ending in a view or a negation does not end the search);
    a kernel whose chain would end in a regrouped view leaves that view to PyTorch, so an op after it
    (GPT-2's transpose of [B, H, S, D]) reads the shape it expects."""
    from cuforge.kernels.families import one_kernel
    from cuforge.kernels.partition import partition

    p = load_problem("models/gpt2_attention@fp16")
    parts = [(q.family.name if q.family else "torch", q.start, q.end) for q in partition(p, one_kernel)]
    assert ("gemm_softmax", 2, 9) in parts, parts
    for q in partition(p, one_kernel):
        if q.family is not None:
            assert tuple(q.problem.outputs[0].shape) == tuple(q.problem.graph[-1].shape)
            assert q.problem.graph[-1].op not in ("view", "_unsafe_view") or q.family.name == "gemm_softmax"
    assert parts[-1] == ("torch", 11, 12)  # the product's view to [B, H, S, D]
