"""RMSNorm: x * rsqrt(mean(x^2) + eps) * weight. FLOPs: 4 per element."""
import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS, HIDDEN = 16384, 8192
EPS = 1e-6

CUFORGE = {
    'description': 'rmsnorm, fp32',
    'dtype': 'float32',
    'flops': '4 * ROWS * HIDDEN',
    'bytes': '4 * (2 * ROWS * HIDDEN + HIDDEN)',
    'families': ['norm'],
    'small': {'ROWS': 9, 'HIDDEN': 80},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(HIDDEN) + 0.5)

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS) * self.weight


def get_inputs():
    return [torch.randn(ROWS, HIDDEN)]


def get_init_inputs():
    return []
