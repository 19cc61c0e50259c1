"""C = A @ B, square fp32 matrices."""
import torch
import torch.nn as nn
import torch.nn.functional as F

N = 4096

CUFORGE = {
    'description': 'square fp32 matmul',
    'dtype': 'float32',
    'flops': '2 * N**3',
    'bytes': '4 * 3 * N * N',
    'families': ['gemm'],
    'small': {'N': 48},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.matmul(A, B)


def get_inputs():
    return [torch.randn(N, N), torch.randn(N, N)]


def get_init_inputs():
    return []
