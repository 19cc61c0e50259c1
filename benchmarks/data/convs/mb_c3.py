"""MobileNetV2 projection: 1x1 144 -> 24, BN, the identity added; batch 32 at 56 x 56."""
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
        self.conv, self.bn = nn.Conv2d(144, 24, 1, bias=False), _bn(24)
        self.eval()

    def forward(self, x, res):
        return self.bn(self.conv(x)) + res


def get_inputs():
    return [torch.randn(32, 144, 56, 56), torch.randn(32, 24, 56, 56)]


def get_init_inputs():
    return []
