"""One step of a 1024-unit GRU, batch 64: the input and hidden projections, reset and update gates."""
import torch
import torch.nn as nn

BATCH, INPUT, HIDDEN = 64, 1024, 1024

CUFORGE = {
    'description': 'GRU cell step',
    'dtype': 'float32',
    'dtypes': ['fp32', 'bf16', 'fp16'],
    'flops': '6 * BATCH * HIDDEN * (INPUT + HIDDEN)',
    'bytes': '4 * (3 * HIDDEN * (INPUT + HIDDEN) + BATCH * (INPUT + 2 * HIDDEN))',
    'families': ['gemm', 'fused'],
    'policy': 'mixed',
    'small': {'BATCH': 3, 'INPUT': 16, 'HIDDEN': 8},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.GRUCell(INPUT, HIDDEN)

    def forward(self, x, h):
        return self.cell(x, h)


def get_inputs():
    return [torch.randn(BATCH, INPUT), torch.randn(BATCH, HIDDEN)]


def get_init_inputs():
    return []
