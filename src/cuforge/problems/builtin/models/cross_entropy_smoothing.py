"""An LLM's training loss: cross-entropy over a 32000-token vocabulary with label smoothing 0.1 and
padding positions ignored (ignore_index), 2048 positions."""
import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS, VOCAB = 2048, 32000
PAD = -100

CUFORGE = {
    'description': 'cross-entropy, label smoothing 0.1, ignore_index',
    'dtype': 'float32',
    # Not fp16: PyTorch's own fp16 result is inf (the smoothing term sums 32000 log-probabilities, about
    # 3e5, past fp16's 65504), and mixed-precision training runs this loss in fp32 under autocast.
    'dtypes': ['fp32', 'bf16'],
    'flops': '6 * ROWS * VOCAB',
    'bytes': '4 * ROWS * VOCAB + 8 * ROWS',
    'families': ['reduction', 'softmax'],
    'policy': 'mixed',
    'small': {'ROWS': 12, 'VOCAB': 50},
}


class Model(nn.Module):
    def forward(self, logits, targets):
        return F.cross_entropy(logits, targets, ignore_index=PAD, label_smoothing=0.1)


def get_inputs():
    targets = torch.randint(0, VOCAB, (ROWS,))
    targets[::7] = PAD  # padding positions
    return [torch.randn(ROWS, VOCAB), targets]


def get_init_inputs():
    return []
