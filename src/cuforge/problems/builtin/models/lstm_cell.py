"""One step of a 1024-unit LSTM (a language model's or a speech encoder's), batch 64: the input and
hidden projections and the four gates."""
import torch
import torch.nn as nn

BATCH, INPUT, HIDDEN = 64, 1024, 1024

CUFORGE = {
    'description': 'LSTM cell step',
    'dtype': 'float32',
    'dtypes': ['fp32', 'bf16', 'fp16'],
    'flops': '8 * BATCH * HIDDEN * (INPUT + HIDDEN)',
    'bytes': '4 * (4 * HIDDEN * (INPUT + HIDDEN) + BATCH * (INPUT + 4 * HIDDEN))',
    'families': ['gemm', 'fused'],
    'policy': 'mixed',
    'small': {'BATCH': 3, 'INPUT': 16, 'HIDDEN': 8},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(INPUT, HIDDEN)

    def forward(self, x, h, c):
        return self.cell(x, (h, c))


def get_inputs():
    return [torch.randn(BATCH, INPUT), torch.randn(BATCH, HIDDEN), torch.randn(BATCH, HIDDEN)]


def get_init_inputs():
    return []
