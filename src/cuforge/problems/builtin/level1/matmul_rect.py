"""C = A @ B with rectangular fp32 matrices."""
import torch
import torch.nn as nn
import torch.nn.functional as F

M, K, N = 8192, 2048, 4096

CUFORGE = {
    'description': 'rectangular fp32 matmul',
    'dtype': 'float32',
    'flops': '2 * M * N * K',
    'bytes': '4 * (M * K + K * N + M * N)',
    'families': ['gemm'],
    'small': {'M': 40, 'K': 24, 'N': 56},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.matmul(A, B)


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
