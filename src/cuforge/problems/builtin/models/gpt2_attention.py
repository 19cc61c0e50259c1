"""GPT-2 small's attention core written out as the original code does: softmax(Q K^T / sqrt(d)
with the causal mask) V, 12 heads of 64 over 1024 positions, batch 4."""
import math

import torch
import torch.nn as nn

BATCH, HEADS, SEQ, HEAD_DIM = 4, 12, 1024, 64

CUFORGE = {
    'description': 'causal attention written out (GPT-2)',
    'dtype': 'float32',
    'dtypes': ['fp32', 'bf16', 'fp16'],
    'flops': '4 * BATCH * HEADS * SEQ * SEQ * HEAD_DIM',
    'bytes': '4 * 4 * BATCH * HEADS * SEQ * HEAD_DIM',
    'families': ['fused'],
    'policy': 'mixed',
    'small': {'BATCH': 1, 'HEADS': 2, 'SEQ': 16, 'HEAD_DIM': 8},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("mask", torch.tril(torch.ones(SEQ, SEQ, dtype=torch.bool)), persistent=False)

    def forward(self, q, k, v):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(~self.mask, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v


def get_inputs():
    return [torch.randn(BATCH, HEADS, SEQ, HEAD_DIM) for _ in range(3)]


def get_init_inputs():
    return []
