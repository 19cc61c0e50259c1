"""Pointwise (1x1) convolution, NCHW fp32, no bias."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, C_IN, C_OUT, H, W = 32, 256, 256, 128, 128

CUFORGE = {
    'description': '1x1 convolution, fp32',
    'dtype': 'float32',
    'flops': '2 * BATCH * C_OUT * H * W * C_IN',
    'bytes': '4 * (BATCH * C_IN * H * W + C_OUT * C_IN + BATCH * C_OUT * H * W)',
    'families': ['conv'],
    'small': {'BATCH': 2, 'C_IN': 8, 'C_OUT': 12, 'H': 9, 'W': 7},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(C_IN, C_OUT, kernel_size=1, bias=False)

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.randn(BATCH, C_IN, H, W)]


def get_init_inputs():
    return []
