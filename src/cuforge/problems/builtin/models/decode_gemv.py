"""One decode step through LLaMA-7B's up projection: a single 4096-wide token times the 11008 x 4096
weight. Bound by reading the weight once."""
import torch
import torch.nn as nn

HIDDEN, FFN = 4096, 11008

CUFORGE = {
    'description': 'decode GEMV, 1 x 4096 @ 4096 x 11008',
    'dtype': 'float32',
    'dtypes': ['fp32', 'bf16', 'fp16'],
    'flops': '2 * HIDDEN * FFN',
    'bytes': '4 * (HIDDEN * FFN + HIDDEN + FFN)',
    'families': ['gemm'],
    'policy': 'mixed',
    'small': {'HIDDEN': 64, 'FFN': 96},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(HIDDEN, FFN, bias=False)

    def forward(self, x):
        return self.proj(x)


def get_inputs():
    return [torch.randn(1, HIDDEN)]


def get_init_inputs():
    return []
