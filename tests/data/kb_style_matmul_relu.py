import torch
import torch.nn as nn

# A KernelBench-style problem: no cuforge metadata at all.
batch_size = 16
in_features = 32
out_features = 24


class Model(nn.Module):
    """Linear layer followed by ReLU."""

    def __init__(self, in_features, out_features):
        super(Model, self).__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.relu(self.linear(x))


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
