"""(x @ W.T + b) * SCALE + residual, fp32. FLOPs: 2MNK + 3 per output."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, IN_F, OUT_F = 4096, 4096, 4096
SCALE = 0.5

CUFORGE = {
    'description': 'linear + scale + residual add, fp32',
    'dtype': 'float32',
    'flops': '2 * BATCH * IN_F * OUT_F + 3 * BATCH * OUT_F',
    'bytes': '4 * (BATCH * IN_F + OUT_F * IN_F + OUT_F + 2 * BATCH * OUT_F)',
    'families': ['gemm', 'elementwise', 'fused'],
    'small': {'BATCH': 24, 'IN_F': 40, 'OUT_F': 56},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(IN_F, OUT_F)

    def forward(self, x, residual):
        return self.linear(x) * SCALE + residual


def get_inputs():
    return [torch.randn(BATCH, IN_F), torch.randn(BATCH, OUT_F)]


def get_init_inputs():
    return []
