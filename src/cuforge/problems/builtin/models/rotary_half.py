"""Rotary position embedding as LLaMA applies it (the two halves of each head rotated): queries of
32 heads of 128 over 1024 positions; cos and sin tables as the model caches them."""
import torch
import torch.nn as nn

BATCH, HEADS, SEQ, HEAD_DIM = 2, 32, 1024, 128
BASE = 10000.0

CUFORGE = {
    'description': 'rotary embedding, half-split (LLaMA)',
    'dtype': 'float32',
    'dtypes': ['fp32', 'bf16', 'fp16'],
    'flops': '3 * BATCH * HEADS * SEQ * HEAD_DIM',
    'bytes': '4 * (2 * BATCH * HEADS * SEQ * HEAD_DIM + 2 * SEQ * HEAD_DIM)',
    'families': ['elementwise'],
    'policy': 'mixed',
    'small': {'BATCH': 1, 'HEADS': 2, 'SEQ': 8, 'HEAD_DIM': 16},
}


class Model(nn.Module):
    def forward(self, q, cos, sin):
        half = q.shape[-1] // 2
        rotated = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
        return q * cos + rotated * sin


def get_inputs():
    inv = 1.0 / (BASE ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
    angles = torch.outer(torch.arange(SEQ).float(), inv)
    emb = torch.cat((angles, angles), dim=-1)
    return [torch.randn(BATCH, HEADS, SEQ, HEAD_DIM), emb.cos(), emb.sin()]


def get_init_inputs():
    return []
