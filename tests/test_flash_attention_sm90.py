"""fp16/bf16 attention on Hopper's wgmma (flash_attention_sm90), on the CPU: it covers what flash_attention
covers at head dims of 64 and 128 and says why not elsewhere, goes ahead of flash_attention at head dim
128 (timed faster there, level at 64), reads Q, K and V through TMA maps of 128-byte rows,
and every seed and random config compiles for sm_90a without spilling."""

import subprocess

import pytest

from cuforge.kernels.families import families_for
from cuforge.kernels.flash_attention_sm90 import FlashAttentionSm90
from cuforge.problems.loader import load_in_dtype
from cuforge.problems.suites import load_problem
from template_helpers import problem_from_expr, smoke_compile
from test_flash_attention import qkv

FAM = FlashAttentionSm90()


@pytest.mark.parametrize("ref, dtype, first", [("models/gqa_attention", "bf16", FAM.name),
                                              ("models/gpt2_attention", "fp16", "flash_attention")])
def test_the_models_suite_s_attention(ref, dtype, first):
    p = load_in_dtype(load_problem(ref), dtype)
    assert FAM.supports(p) is None
    names = [f.name for f in families_for(p)[0]]
    assert names[:2] == [first, ({FAM.name, "flash_attention"} - {first}).pop()], names
    assert FAM.leads(p) == (FAM.match(p).d == 128)
    assert FAM.runs_on("9.0") and not FAM.runs_on("8.0")
    seeds = FAM.seeds(p)
    assert seeds[0] == {"BN": 128, "STAGES": 2} and all(FAM.valid(c, p) for c in seeds)
    launch = FAM.render(seeds[0], p).launch
    assert launch.args[:3] == ("tma_2d(in0, 64, 128)", "tma_2d(in1, 64, 128)", "tma_2d(in2, 64, 128)")
    assert launch.block == "(256,)" and launch.grid.startswith("(cdiv(SQ, 128), ")
    smoke_compile(FAM, p, 1)


def test_shared_memory_counts_q_the_stages_and_the_alignment_slack():
    assert FAM.smem_bytes({"BN": 128, "STAGES": 2}, 128) == (128 + 4 * 128) * 256 + 24 + 1024
    assert FAM.smem_bytes({"BN": 128, "STAGES": 3}, 128) <= 227 * 1024  # the largest preset still fits


@pytest.mark.parametrize("q, kv, why", [((2, 4, 64, 96), (2, 4, 64, 96), "head dim 96"), ((8, 100, 32), (8, 72, 32), "head dim 32")])
def test_other_head_dims_are_left_to_flash_attention(tmp_path, q, kv, why):
    p = problem_from_expr(tmp_path, "F.scaled_dot_product_attention(q, k, v)", qkv(str(q), str(kv), str(kv)), args="q, k, v")
    assert why in FAM.supports(p) and families_for(p)[0][0].name == "flash_attention"


def test_no_config_spills_and_masks_compile(tmp_path):
    # a causal grouped-query attention of head dim 64 and a bool mask at 128: the rendered kernels go through
    # ptxas with -v, which names any spill
    causal = problem_from_expr(tmp_path, "F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)",
                               qkv("(2, 8, 64, 64)", "(2, 2, 64, 64)", "(2, 2, 64, 64)"), args="q, k, v")
    masked = problem_from_expr(tmp_path, "F.scaled_dot_product_attention(q, k, v, attn_mask=m)",
                               qkv("(2, 4, 64, 128)", "(2, 4, 96, 128)", "(2, 4, 96, 128)", extra=", torch.rand(64, 96) > 0.2"),
                               args="q, k, v, m")
    for p in (causal, masked):
        for c in FAM.seeds(p):
            src = tmp_path / "k.cu"
            src.write_text(FAM.render(c, p).source)
            r = subprocess.run(["nvcc", "-arch=sm_90a", "-cubin", "-Xptxas", "-v", "-o", str(tmp_path / "k.cubin"), str(src)],
                               capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, r.stderr[-2000:]
            assert "0 bytes spill stores" in r.stderr and "serialized" not in r.stderr, r.stderr[-2000:]
