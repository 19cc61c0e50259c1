"""sum(sigmoid(x @ W.T + b), dim=1), fp32. FLOPs: 2MNK + 6 per GEMM output."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, IN_F, OUT_F = 8192, 2048, 2048

CUFORGE = {
    'description': 'linear + sigmoid + row sum, fp32',
    'dtype': 'float32',
    'flops': '2 * BATCH * IN_F * OUT_F + 6 * BATCH * OUT_F',
    'bytes': '4 * (BATCH * IN_F + OUT_F * IN_F + OUT_F + BATCH)',
    'families': ['gemm', 'elementwise', 'reduction', 'fused'],
    'small': {'BATCH': 24, 'IN_F': 40, 'OUT_F': 56},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(IN_F, OUT_F)

    def forward(self, x):
        return torch.sigmoid(self.linear(x)).sum(dim=1)


def get_inputs():
    return [torch.randn(BATCH, IN_F)]


def get_init_inputs():
    return []
