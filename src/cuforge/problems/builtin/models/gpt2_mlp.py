"""GPT-2 small's MLP: Linear 768 -> 3072, GELU (tanh approximation), Linear 3072 -> 768, over a batch
of 4 sequences of 1024 tokens."""
import torch
import torch.nn as nn
import torch.nn.functional as F

TOKENS, HIDDEN, FFN = 4096, 768, 3072

CUFORGE = {
    'description': 'GPT-2 MLP with tanh GELU',
    'dtype': 'float32',
    'dtypes': ['fp32', 'bf16', 'fp16'],
    'flops': '4 * TOKENS * HIDDEN * FFN',
    'bytes': '4 * (2 * TOKENS * HIDDEN + 2 * HIDDEN * FFN + FFN + HIDDEN)',
    'families': ['gemm', 'fused'],
    'policy': 'mixed',
    'small': {'TOKENS': 6, 'HIDDEN': 32, 'FFN': 64},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(HIDDEN, FFN)
        self.proj = nn.Linear(FFN, HIDDEN)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN)]


def get_init_inputs():
    return []
