"""LLaMA-7B's feed-forward block: down(silu(gate(x)) * up(x)), 4096 -> 11008 -> 4096, no biases,
over a prefill chunk of 512 tokens."""
import torch
import torch.nn as nn
import torch.nn.functional as F

TOKENS, HIDDEN, FFN = 512, 4096, 11008

CUFORGE = {
    'description': 'SwiGLU MLP (LLaMA), prefill chunk',
    'dtype': 'float32',
    'dtypes': ['fp32', 'bf16', 'fp16'],
    'flops': '6 * TOKENS * HIDDEN * FFN',
    'bytes': '4 * (2 * TOKENS * HIDDEN + 3 * HIDDEN * FFN)',
    'families': ['gemm', 'fused'],
    'policy': 'mixed',
    'small': {'TOKENS': 4, 'HIDDEN': 32, 'FFN': 48},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(HIDDEN, FFN, bias=False)
        self.up = nn.Linear(HIDDEN, FFN, bias=False)
        self.down = nn.Linear(FFN, HIDDEN, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN)]


def get_init_inputs():
    return []
