"""softmax(x * SCALE + causal mask), fp16. FLOPs: 7 per element."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, HEADS, SEQ = 128, 16, 512
SCALE = 0.125

CUFORGE = {
    'description': 'causal-masked scaled softmax, fp16',
    'dtype': 'float16',
    'flops': '7 * BATCH * HEADS * SEQ * SEQ',
    'bytes': '2 * 2 * BATCH * HEADS * SEQ * SEQ',
    'families': ['softmax', 'elementwise', 'fused'],
    'small': {'BATCH': 2, 'HEADS': 3, 'SEQ': 33},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        mask = torch.ones(SEQ, SEQ, dtype=torch.bool, device=x.device).triu(1)
        return torch.softmax((x * SCALE).masked_fill(mask, float('-inf')), dim=-1)


def get_inputs():
    return [torch.randn(BATCH, HEADS, SEQ, SEQ, dtype=torch.float16)]


def get_init_inputs():
    return []
