"""fp16/bf16 attention as one flash kernel on a real GPU, judged against the float64 reference at the
bound PyTorch's own half-precision attention sets: the models suite's grouped-query SDPA and GPT-2's
written-out attention with every seed, and ragged forms (rows and keys that fill no tile, a causal
diagonal inside a tile, a bool mask, a float mask, a scale, scores cast to fp32 by hand)."""

import pytest

from cuforge.kernels.families import families_for
from cuforge.kernels.flash_attention import FlashAttention
from cuforge.kernels.flash_attention_sm90 import FlashAttentionSm90
from cuforge.problems.loader import load_in_dtype
from cuforge.problems.suites import load_problem
from template_helpers import assert_all_ok, family_configs, problem_from_expr, skip_unless_sm90

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("ref", ["models/gqa_attention", "models/gpt2_attention"])
def test_the_models_suite_s_attention(sup, ref, dtype):
    fam = FlashAttention()
    p = load_in_dtype(load_problem(ref), dtype)
    assert fam.supports(p) is None
    assert_all_ok(sup, fam, p, fam.seeds(p), what=(ref, dtype))


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("ref", ["models/gqa_attention", "models/gpt2_attention"])
def test_the_models_suite_s_attention_on_wgmma(sup, ref, dtype):
    skip_unless_sm90(sup, "wgmma and TMA are sm_90a's")
    fam = FlashAttentionSm90()
    p = load_in_dtype(load_problem(ref), dtype)
    assert fam.supports(p) is None
    assert_all_ok(sup, fam, p, fam.seeds(p), what=(ref, dtype))


def _qkv(q, k, v, dt, extra=""):
    return ", ".join(f"torch.randn{s[:-1]}, dtype={dt})" for s in (q, k, v)) + extra


def ragged_cases(tmp_path, dtype, scaled, biased):
    """(expr, problem): rows and keys that fill no tile, a causal diagonal inside a tile with grouped heads, a
    scale (q's and k's shapes `scaled`), a bool mask, a float mask as a bias (head dim `biased`), scores cast
    to fp32 by hand."""
    cases = [
        ("F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)",
         _qkv("(2, 6, 77, 64)", "(2, 2, 77, 64)", "(2, 2, 77, 64)", dtype)),
        ("F.scaled_dot_product_attention(q, k, v, scale=0.3)", _qkv(scaled[0], scaled[1], scaled[1], dtype)),
        ("F.scaled_dot_product_attention(q, k, v, attn_mask=m)",
         _qkv("(2, 3, 64, 128)", "(2, 3, 96, 128)", "(2, 3, 96, 128)", dtype, ", torch.rand(64, 96) > 0.3")),
        ("F.scaled_dot_product_attention(q, k, v, attn_mask=m)",
         _qkv(f"(2, 3, 50, {biased})", f"(2, 3, 130, {biased})", f"(2, 3, 130, {biased})", dtype, f", torch.randn(50, 130, dtype={dtype})")),
        ("torch.softmax((q @ k.transpose(-2, -1)).float() * 0.125, -1).to(q.dtype) @ v",
         _qkv("(3, 200, 64)", "(3, 200, 64)", "(3, 200, 64)", dtype)),
    ]
    for expr, inputs in cases:
        args = "q, k, v, m" if "attn_mask" in expr else "q, k, v"
        yield expr, problem_from_expr(tmp_path, expr, inputs, args=args, prefix="gpu")


@pytest.mark.parametrize("dtype", ["torch.bfloat16", "torch.float16"])
def test_ragged_and_masked_forms(sup, tmp_path, dtype):
    fam = FlashAttention()
    for expr, p in ragged_cases(tmp_path, dtype, ("(5, 100, 32)", "(5, 72, 32)"), 96):
        names = [f.name for f in families_for(p)[0]]  # on Hopper the wgmma kernel leads at head dim 128
        assert names[0] == "flash_attention" or names[:2] == ["flash_attention_sm90", "flash_attention"], (expr, names)
        # The first three seeds and two valid configs drawn at random (the search proposes such too).
        configs = family_configs(fam, p, 2)
        assert_all_ok(sup, fam, p, configs[:3] + configs[len(fam.seeds(p)):], what=(expr, dtype))


@pytest.mark.parametrize("dtype", ["torch.bfloat16", "torch.float16"])
def test_ragged_and_masked_forms_on_wgmma(sup, tmp_path, dtype):
    """The same forms at head dims of 64 and 128, with more query rows than key rows in the scaled case (its
    last block's rows run into the next head's in the tall views TMA reads)."""
    skip_unless_sm90(sup, "wgmma and TMA are sm_90a's")
    fam = FlashAttentionSm90()
    for expr, p in ragged_cases(tmp_path, dtype, ("(5, 300, 128)", "(5, 200, 128)"), 64):
        assert fam.supports(p) is None, (expr, fam.supports(p))
        assert_all_ok(sup, fam, p, fam.seeds(p), what=(expr, dtype))
