"""Speculative decoding's verify step: 8 tokens through a Mistral-7B attention output projection
(4096 -> 4096 with no bias): a GEMM of 8 rows, still bound by the weight."""
import torch
import torch.nn as nn

TOKENS, HIDDEN = 8, 4096

CUFORGE = {
    'description': 'skinny GEMM, 8 x 4096 @ 4096 x 4096',
    'dtype': 'float32',
    'dtypes': ['fp32', 'bf16', 'fp16'],
    'flops': '2 * TOKENS * HIDDEN * HIDDEN',
    'bytes': '4 * (HIDDEN * HIDDEN + 2 * TOKENS * HIDDEN)',
    'families': ['gemm'],
    'policy': 'mixed',
    'small': {'TOKENS': 8, 'HIDDEN': 64},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.o_proj = nn.Linear(HIDDEN, HIDDEN, bias=False)

    def forward(self, x):
        return self.o_proj(x)


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN)]


def get_init_inputs():
    return []
