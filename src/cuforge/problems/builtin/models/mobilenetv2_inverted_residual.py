"""MobileNetV2's inverted residual at 56 x 56 in inference: 1x1 expansion 24 -> 144, 3x3 depthwise,
1x1 projection back to 24 (eval-mode batch norm after each, ReLU6 after the first two), plus the
identity; batch 32."""
import torch
import torch.nn as nn

BATCH, CH, EXPAND, HW = 32, 24, 6, 56

CUFORGE = {
    'description': 'MobileNetV2 inverted residual block',
    'dtype': 'float32',
    'dtypes': ['fp32', 'bf16', 'fp16'],
    'flops': '2 * BATCH * HW * HW * (2 * CH * CH * EXPAND + 9 * CH * EXPAND)',
    'bytes': '4 * (2 * BATCH * CH * HW * HW + 2 * CH * CH * EXPAND + 9 * CH * EXPAND)',
    'families': ['conv', 'norm', 'elementwise'],
    'policy': 'mixed',
    'small': {'BATCH': 1, 'CH': 4, 'HW': 6},
}


def _bn(c):
    bn = nn.BatchNorm2d(c)
    with torch.no_grad():
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 1.5)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    return bn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        hidden = CH * EXPAND
        self.block = nn.Sequential(
            nn.Conv2d(CH, hidden, 1, bias=False), _bn(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False), _bn(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, CH, 1, bias=False), _bn(CH))
        self.eval()

    def forward(self, x):
        return x + self.block(x)


def get_inputs():
    return [torch.randn(BATCH, CH, HW, HW)]


def get_init_inputs():
    return []
