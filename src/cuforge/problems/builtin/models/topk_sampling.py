"""Top-k sampling's first step in LLM serving: the 50 largest logits (values and indices) of each of
64 sequences over a 32000-token vocabulary."""
import torch
import torch.nn as nn

BATCH, VOCAB, K = 64, 32000, 50

CUFORGE = {
    'description': 'top-k of logits, k = 50',
    'dtype': 'float32',
    'dtypes': ['fp32'],  # in half precision, equal logits are common and their order is PyTorch's choice
    'flops': 'BATCH * VOCAB',
    'bytes': '4 * BATCH * VOCAB + 12 * BATCH * K',
    'families': ['reduction'],
    'policy': 'mixed',
    'small': {'BATCH': 3, 'VOCAB': 64, 'K': 5},
}


class Model(nn.Module):
    def forward(self, logits):
        return torch.topk(logits, K, dim=-1)


def get_inputs():
    return [torch.randn(BATCH, VOCAB)]


def get_init_inputs():
    return []
