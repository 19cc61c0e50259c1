"""MobileNetV2 depthwise: 3x3 over 144 channels, BN, ReLU6; batch 32 at 56 x 56."""
import torch
import torch.nn as nn

CUFORGE = {'dtype': 'float32', 'dtypes': ['bf16']}


def _bn(c):
    bn = nn.BatchNorm2d(c)
    with torch.no_grad():
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 1.5)
    return bn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(144, 144, 3, padding=1, groups=144, bias=False), _bn(144)
        self.eval()

    def forward(self, x):
        return torch.clamp(self.bn(self.conv(x)), 0, 6)


def get_inputs():
    return [torch.randn(32, 144, 56, 56)]


def get_init_inputs():
    return []
