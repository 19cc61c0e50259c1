"""LayerNorm over the last dim with affine weight and bias. FLOPs: 8 per element."""
import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS, HIDDEN = 16384, 8192

CUFORGE = {
    'description': 'layernorm, fp32',
    'dtype': 'float32',
    'flops': '8 * ROWS * HIDDEN',
    'bytes': '4 * (2 * ROWS * HIDDEN + 2 * HIDDEN)',
    'families': ['norm'],
    'small': {'ROWS': 9, 'HIDDEN': 80},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(HIDDEN)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.norm(x)


def get_inputs():
    return [torch.randn(ROWS, HIDDEN)]


def get_init_inputs():
    return []
