"""x + GELU(LayerNorm(x)), fp32. FLOPs: 17 per element."""
import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS, HIDDEN = 16384, 8192

CUFORGE = {
    'description': 'layernorm + GELU + residual, fp32',
    'dtype': 'float32',
    'flops': '17 * ROWS * HIDDEN',
    'bytes': '4 * (2 * ROWS * HIDDEN + 2 * HIDDEN)',
    'families': ['norm', 'elementwise', 'fused'],
    'small': {'ROWS': 9, 'HIDDEN': 80},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(HIDDEN)

    def forward(self, x):
        return x + F.gelu(self.norm(x))


def get_inputs():
    return [torch.randn(ROWS, HIDDEN)]


def get_init_inputs():
    return []
