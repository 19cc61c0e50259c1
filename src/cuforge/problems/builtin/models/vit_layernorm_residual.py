"""A ViT-B/16 block's pre-norm seam: the residual stream plus the attention output, then LayerNorm(768)
of the sum for the MLP (batch 32 of 197 tokens)."""
import torch
import torch.nn as nn

BATCH, TOKENS, HIDDEN = 32, 197, 768

CUFORGE = {
    'description': 'residual add + LayerNorm (ViT-B/16)',
    'dtype': 'float32',
    'dtypes': ['fp32', 'bf16', 'fp16'],
    'flops': '9 * BATCH * TOKENS * HIDDEN',
    'bytes': '4 * (4 * BATCH * TOKENS * HIDDEN + 2 * HIDDEN)',
    'families': ['norm', 'elementwise'],
    'policy': 'mixed',
    'small': {'BATCH': 2, 'TOKENS': 5, 'HIDDEN': 32},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(HIDDEN, eps=1e-6)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x, attn_out):
        x = x + attn_out
        return x, self.norm(x)


def get_inputs():
    return [torch.randn(BATCH, TOKENS, HIDDEN), torch.randn(BATCH, TOKENS, HIDDEN)]


def get_init_inputs():
    return []
