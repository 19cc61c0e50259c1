"""LayerNorm(x @ W.T + b), fp32. FLOPs: 2MNK + 9 per output."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, IN_F, OUT_F = 8192, 2048, 4096

CUFORGE = {
    'description': 'linear + layernorm, fp32',
    'dtype': 'float32',
    'flops': '2 * BATCH * IN_F * OUT_F + 9 * BATCH * OUT_F',
    'bytes': '4 * (BATCH * IN_F + OUT_F * IN_F + OUT_F + 2 * OUT_F + BATCH * OUT_F)',
    'families': ['gemm', 'norm', 'fused'],
    'small': {'BATCH': 24, 'IN_F': 40, 'OUT_F': 56},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(IN_F, OUT_F)
        self.norm = nn.LayerNorm(OUT_F)

    def forward(self, x):
        return self.norm(self.linear(x))


def get_inputs():
    return [torch.randn(BATCH, IN_F)]


def get_init_inputs():
    return []
