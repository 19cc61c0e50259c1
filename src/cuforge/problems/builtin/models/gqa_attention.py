"""Causal grouped-query attention as Mistral-7B and LLaMA-2-70B run it: 32 query heads sharing 8
key/value heads, head dim 128, prefill of 2048 tokens, through scaled_dot_product_attention."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, HEADS, KV_HEADS, SEQ, HEAD_DIM = 1, 32, 8, 2048, 128

CUFORGE = {
    'description': 'causal GQA attention (SDPA), prefill',
    'dtype': 'float32',
    'dtypes': ['fp32', 'bf16', 'fp16'],
    'flops': '2 * BATCH * HEADS * SEQ * SEQ * HEAD_DIM',  # causal: half of 4 * ...
    'bytes': '4 * BATCH * SEQ * HEAD_DIM * (2 * HEADS + 2 * KV_HEADS)',
    'families': ['fused'],
    'policy': 'mixed',
    'small': {'HEADS': 4, 'KV_HEADS': 2, 'SEQ': 16, 'HEAD_DIM': 8},
}


class Model(nn.Module):
    def forward(self, q, k, v):
        group = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def get_inputs():
    return [torch.randn(BATCH, HEADS, SEQ, HEAD_DIM), torch.randn(BATCH, KV_HEADS, SEQ, HEAD_DIM),
            torch.randn(BATCH, KV_HEADS, SEQ, HEAD_DIM)]


def get_init_inputs():
    return []
