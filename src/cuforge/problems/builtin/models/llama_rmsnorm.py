"""LLaMA/Mistral RMSNorm: x * rsqrt(mean(x^2) + eps) * weight over the 4096-wide hidden state of a
prefill of 8 sequences of 512 tokens (computed in fp32 and cast back, as the models do)."""
import torch
import torch.nn as nn

TOKENS, HIDDEN = 4096, 4096
EPS = 1e-5

CUFORGE = {
    'description': 'LLaMA RMSNorm, prefill',
    'dtype': 'float32',
    'dtypes': ['fp32', 'bf16', 'fp16'],
    'flops': '4 * TOKENS * HIDDEN',
    'bytes': '4 * (2 * TOKENS * HIDDEN + HIDDEN)',
    'families': ['norm'],
    'policy': 'mixed',
    'small': {'TOKENS': 12, 'HIDDEN': 64},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(HIDDEN).uniform_(0.5, 1.5))

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
        return self.weight * h.to(x.dtype)


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN)]


def get_init_inputs():
    return []
