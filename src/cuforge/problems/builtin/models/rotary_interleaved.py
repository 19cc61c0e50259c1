"""Rotary position embedding as GPT-J and GPT-NeoX-style interleaved variants apply it: each pair of
adjacent features rotated by its position's angle; keys of 16 heads of 256 over 2048 positions."""
import torch
import torch.nn as nn

BATCH, HEADS, SEQ, HEAD_DIM = 1, 16, 2048, 256
BASE = 10000.0

CUFORGE = {
    'description': 'rotary embedding, interleaved pairs (GPT-J)',
    'dtype': 'float32',
    'dtypes': ['fp32', 'bf16', 'fp16'],
    'flops': '3 * BATCH * HEADS * SEQ * HEAD_DIM',
    'bytes': '4 * (2 * BATCH * HEADS * SEQ * HEAD_DIM + SEQ * HEAD_DIM)',
    'families': ['elementwise'],
    'policy': 'mixed',
    'small': {'BATCH': 1, 'HEADS': 2, 'SEQ': 8, 'HEAD_DIM': 16},
}


class Model(nn.Module):
    def forward(self, k, cos, sin):
        even, odd = k[..., 0::2], k[..., 1::2]
        out = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
        return out.flatten(-2)


def get_inputs():
    inv = 1.0 / (BASE ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
    angles = torch.outer(torch.arange(SEQ).float(), inv)
    return [torch.randn(BATCH, HEADS, SEQ, HEAD_DIM), angles.cos(), angles.sin()]


def get_init_inputs():
    return []
