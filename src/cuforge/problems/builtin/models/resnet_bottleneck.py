"""ResNet-50's bottleneck block of stage 1 in inference: 1x1 conv 256 -> 64, 3x3 conv 64 -> 64, 1x1
conv 64 -> 256, each followed by eval-mode batch norm, ReLU between, the identity added before the
last ReLU; batch 16 at 56 x 56."""
import torch
import torch.nn as nn

BATCH, CH, MID, HW = 16, 256, 64, 56

CUFORGE = {
    'description': 'ResNet-50 bottleneck, eval-mode batch norm',
    'dtype': 'float32',
    'dtypes': ['fp32', 'bf16', 'fp16'],
    'flops': '2 * BATCH * HW * HW * (CH * MID + 9 * MID * MID + MID * CH)',
    'bytes': '4 * (2 * BATCH * CH * HW * HW + CH * MID * 2 + 9 * MID * MID)',
    'families': ['conv', 'norm', 'elementwise'],
    'policy': 'mixed',
    'small': {'BATCH': 1, 'CH': 16, 'MID': 4, 'HW': 6},
}


def _bn(c):
    bn = nn.BatchNorm2d(c)
    with torch.no_grad():  # trained statistics, not the initial ones
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 1.5)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    return bn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(CH, MID, 1, bias=False), _bn(MID)
        self.conv2, self.bn2 = nn.Conv2d(MID, MID, 3, padding=1, bias=False), _bn(MID)
        self.conv3, self.bn3 = nn.Conv2d(MID, CH, 1, bias=False), _bn(CH)
        self.eval()

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = torch.relu(self.bn2(self.conv2(out)))
        return torch.relu(self.bn3(self.conv3(out)) + x)


def get_inputs():
    return [torch.randn(BATCH, CH, HW, HW)]


def get_init_inputs():
    return []
