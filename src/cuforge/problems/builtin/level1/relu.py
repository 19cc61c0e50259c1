"""ReLU over a large fp32 tensor (memory-bound). FLOPs: 1 per element by convention."""
import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS, COLS = 4096, 65536

CUFORGE = {
    'description': 'ReLU, fp32',
    'dtype': 'float32',
    'flops': '1 * ROWS * COLS',
    'bytes': '4 * 2 * ROWS * COLS',
    'families': ['elementwise'],
    'small': {'ROWS': 17, 'COLS': 96},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
