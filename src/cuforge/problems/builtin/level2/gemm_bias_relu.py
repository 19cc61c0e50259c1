"""ReLU(x @ W.T + b), fp16 with fp32 accumulation. FLOPs: 2MNK + 2 per output."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, IN_F, OUT_F = 8192, 8192, 8192

CUFORGE = {
    'description': 'linear + bias + ReLU, fp16',
    'dtype': 'float16',
    'flops': '2 * BATCH * IN_F * OUT_F + 2 * BATCH * OUT_F',
    'bytes': '2 * (BATCH * IN_F + OUT_F * IN_F + OUT_F + BATCH * OUT_F)',
    'families': ['gemm', 'elementwise', 'fused'],
    'small': {'BATCH': 24, 'IN_F': 40, 'OUT_F': 56},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        self.linear = nn.Linear(IN_F, OUT_F, dtype=torch.float16)

    def forward(self, x):
        return torch.relu(self.linear(x))


def get_inputs():
    return [torch.randn(BATCH, IN_F, dtype=torch.float16)]


def get_init_inputs():
    return []
