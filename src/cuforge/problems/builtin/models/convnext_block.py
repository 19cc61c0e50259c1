"""ConvNeXt-T's block of stage 1: 7x7 depthwise conv, LayerNorm over channels (channels-last),
Linear 96 -> 384, GELU, Linear 384 -> 96, layer scale, plus the identity; batch 16 at 56 x 56."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, CH, HW = 16, 96, 56

CUFORGE = {
    'description': 'ConvNeXt block',
    'dtype': 'float32',
    'dtypes': ['fp32', 'bf16', 'fp16'],
    'flops': '2 * BATCH * HW * HW * (49 * CH + 8 * CH * CH)',
    'bytes': '4 * (2 * BATCH * CH * HW * HW + 8 * CH * CH + 49 * CH)',
    'families': ['conv', 'norm', 'gemm', 'fused'],
    'policy': 'mixed',
    'small': {'BATCH': 1, 'CH': 8, 'HW': 9},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.dwconv = nn.Conv2d(CH, CH, 7, padding=3, groups=CH)
        self.norm = nn.LayerNorm(CH, eps=1e-6)
        self.pwconv1 = nn.Linear(CH, 4 * CH)
        self.pwconv2 = nn.Linear(4 * CH, CH)
        self.gamma = nn.Parameter(torch.full((CH,), 0.5))

    def forward(self, x):
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.pwconv2(F.gelu(self.pwconv1(self.norm(y))))
        return x + (self.gamma * y).permute(0, 3, 1, 2)


def get_inputs():
    return [torch.randn(BATCH, CH, HW, HW)]


def get_init_inputs():
    return []
