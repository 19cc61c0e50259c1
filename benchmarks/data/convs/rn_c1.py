"""ResNet bottleneck conv1: 1x1 256 -> 64, BN, ReLU; batch 16 at 56 x 56."""
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
        self.conv, self.bn = nn.Conv2d(256, 64, 1, bias=False), _bn(64)
        self.eval()

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def get_inputs():
    return [torch.randn(16, 256, 56, 56)]


def get_init_inputs():
    return []
