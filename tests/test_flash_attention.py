"""fp16/bf16 attention as one flash kernel, on the CPU: which traced graphs it covers and what it reads
from them (scaled_dot_product_attention as PyTorch decomposes it - causal, grouped-query heads, a bool
mask, a scale, 3-D inputs - and attention written out as GPT-2 does), what it refuses and why, and
that its kernels compile with NVRTC."""

import pytest

from cuforge.kernels.families import families_for
from cuforge.kernels.flash_attention import FlashAttention, match_attention
from cuforge.problems.loader import load_in_dtype
from cuforge.problems.suites import load_problem
from template_helpers import problem_from_expr, smoke_compile


def qkv(q, k, v, dtype="torch.bfloat16", extra=""):
    return ", ".join(f"torch.randn{s[:-1]}, dtype={dtype})" for s in (q, k, v)) + extra


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_the_models_suite_s_grouped_query_attention_is_one_kernel(dtype):
    p = load_in_dtype(load_problem("models/gqa_attention"), dtype)
    fams = [f.name for f in families_for(p)[0]]
    assert fams[:2] == ["flash_attention_sm90", "flash_attention"], fams  # the wgmma kernel leads at head dim 128
    m = match_attention(p)
    # 32 query heads over 8 key/value heads: each K/V head read in place for 4 query heads, the causal
    # mask applied by index (and its hidden tiles skipped), the scale 1/sqrt(128) folded into the
    # exponent: no score chain is left.
    assert (m.heads, m.sq, m.sk, m.d, m.group, m.mask, m.diag, m.safe) == (32, 2048, 2048, 128, 4, "causal", 0, True)
    assert m.scale == pytest.approx(128 ** -0.5) and m.scores.body.strip() == "" and m.scores.tensors == ()
    smoke_compile(FlashAttention(), p, 1)


def test_gpt2_s_written_out_attention_reads_its_mask_buffer():
    p = load_in_dtype(load_problem("models/gpt2_attention"), "fp16")
    m = match_attention(p)
    assert not isinstance(m, str), m
    assert (m.heads, m.d, m.group, m.mask, m.safe) == (48, 64, 1, "none", False)  # softmax: a masked row is NaN
    assert [ref for ref, _ in m.scores.tensors] == ["param0"] and m.scores.masks == frozenset({0})
    # The division by sqrt(64) moves into the exponent past the masked_fill with -inf; the mask stays.
    assert m.scale == 0.125 and "/ 8" not in m.scores.body and "p0[" in m.scores.body
    smoke_compile(FlashAttention(), p, 1)


@pytest.mark.parametrize("expr, inputs, want", [
    ("F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)",
     qkv("(2, 8, 64, 64)", "(2, 2, 64, 64)", "(2, 2, 64, 64)"), (16, 64, 64, 64, 4, "causal")),
    ("F.scaled_dot_product_attention(q, k, v, scale=0.3)",
     qkv("(8, 100, 32)", "(8, 72, 32)", "(8, 72, 32)", "torch.float16"), (8, 100, 72, 32, 1, "none")),
    ("F.scaled_dot_product_attention(q, k, v, attn_mask=m)",
     qkv("(2, 4, 64, 64)", "(2, 4, 96, 64)", "(2, 4, 96, 64)", extra=", torch.rand(64, 96) > 0.2"),
     (8, 64, 96, 64, 1, "keep")),
    ("F.scaled_dot_product_attention(q, k, v, attn_mask=m)",  # a float mask is a bias in the score chain
     qkv("(2, 4, 64, 64)", "(2, 4, 96, 64)", "(2, 4, 96, 64)", extra=", torch.randn(64, 96, dtype=torch.bfloat16)"),
     (8, 64, 96, 64, 1, "none")),
    ("torch.softmax((q @ k.transpose(-2, -1)).float() * 0.125, -1).to(q.dtype) @ v",
     qkv("(3, 50, 64)", "(3, 50, 64)", "(3, 50, 64)"), (3, 50, 50, 64, 1, "none")),
])
def test_forms_of_attention_it_covers(tmp_path, expr, inputs, want):
    args = "q, k, v, m" if "attn_mask" in expr else "q, k, v"
    p = problem_from_expr(tmp_path, expr, inputs, args=args)
    m = match_attention(p)
    assert not isinstance(m, str), m
    assert (m.heads, m.sq, m.sk, m.d, m.group, m.mask) == want
    assert families_for(p)[0][0].name == "flash_attention"
    if m.mask == "keep":
        assert m.keep == "in3"
    smoke_compile(FlashAttention(), p, 1)


@pytest.mark.parametrize("expr, scale, left", [
    ("torch.softmax(q @ k.transpose(-2, -1) * -0.5, -1) @ v", 1.0, "-0.5"),  # the max would be the min
    ("torch.softmax(torch.tanh(q @ k.transpose(-2, -1) * 0.5), -1) @ v", 1.0, "tanh"),
    ("torch.softmax(q @ k.transpose(-2, -1) * 0.5 + 1.0, -1) @ v", 1.0, "0.5"),
    ("torch.softmax(q @ k.transpose(-2, -1) / 4.0, -1) @ v", 0.25, ""),
])
def test_only_a_positive_factor_and_minus_infinity_masks_fold_into_the_exponent(tmp_path, expr, scale, left):
    p = problem_from_expr(tmp_path, expr, qkv("(2, 8, 64)", "(2, 8, 64)", "(2, 8, 64)"), args="q, k, v")
    m = match_attention(p)
    assert not isinstance(m, str), m
    assert m.scale == scale and left in m.scores.body


@pytest.mark.parametrize("expr, inputs, why", [
    ("F.scaled_dot_product_attention(q, k, v)", qkv("(2, 8, 64)", "(2, 8, 64)", "(2, 8, 64)", "torch.float32"),
     "not fp16 or bf16"),
    ("F.scaled_dot_product_attention(q, k, v)", qkv("(2, 8, 40)", "(2, 8, 40)", "(2, 8, 40)"), "head dim 40"),
    ("F.scaled_dot_product_attention(q, k, v)", qkv("(2, 8, 256)", "(2, 8, 256)", "(2, 8, 256)"), "head dim 256"),
    ("F.scaled_dot_product_attention(q, k, v)", qkv("(2, 8, 64)", "(2, 8, 64)", "(2, 8, 32)"), "V's head dim"),
    ("torch.log_softmax(q @ k.transpose(-2, -1), -1) @ v", qkv("(2, 8, 64)", "(2, 8, 64)", "(2, 8, 64)"),
     "log-softmax"),
    ("torch.softmax(q @ k.transpose(-2, -1), -1).sum(-1)", qkv("(2, 8, 64)", "(2, 8, 64)", "(2, 8, 64)"),
     "two products"),
    ("torch.relu(torch.softmax(q @ k.transpose(-2, -1), -1)) @ v", qkv("(2, 8, 64)", "(2, 8, 64)", "(2, 8, 64)"),
     "between the softmax and the product with V"),
    ("torch.softmax(q @ k, -1) @ v", qkv("(2, 8, 64)", "(2, 64, 8)", "(2, 8, 64)"), "laid out"),
    # K and V tiled over the batch (not repeated per head): head h of batch b does not read b's head h // 2
    ("F.scaled_dot_product_attention(q, k.unsqueeze(1).expand(1, 2, 4, 16, 32).reshape(2, 4, 16, 32), "
     "v.unsqueeze(1).expand(1, 2, 4, 16, 32).reshape(2, 4, 16, 32))",
     qkv("(2, 4, 16, 32)", "(1, 4, 16, 32)", "(1, 4, 16, 32)"), "K: "),
])
def test_what_it_refuses_and_why(tmp_path, expr, inputs, why):
    p = problem_from_expr(tmp_path, expr, inputs, args="q, k, v")
    got = match_attention(p)
    assert isinstance(got, str) and why in got, got
    assert "flash_attention" not in [f.name for f in families_for(p)[0]]


@pytest.mark.parametrize("inputs", [
    # q as a (batch, seq, heads, d) tensor viewed (batch, heads, seq, d): rows not where the kernel reads them
    "torch.randn(2, 64, 8, 64, dtype=torch.bfloat16).transpose(1, 2), torch.randn(2, 8, 64, 64, dtype=torch.bfloat16), "
    "torch.randn(2, 8, 64, 64, dtype=torch.bfloat16)",
    qkv("(2, 8, 0, 64)", "(2, 8, 64, 64)", "(2, 8, 64, 64)"),  # no query rows
])
def test_inputs_off_the_common_path_are_refused_by_name(tmp_path, inputs):
    p = problem_from_expr(tmp_path, "F.scaled_dot_product_attention(q, k, v)", inputs, args="q, k, v")
    fams, why = families_for(p)
    assert "flash_attention" not in [f.name for f in fams]
    assert fams or "not covered offline" in why  # another family's kernel, or a refusal naming why
    assert isinstance(match_attention(p), str) or "not covered offline" in why
