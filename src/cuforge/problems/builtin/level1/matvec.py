"""y = A @ x, matrix-vector product (memory-bound)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

M, K = 32768, 16384

CUFORGE = {
    'description': 'fp32 matrix-vector product',
    'dtype': 'float32',
    'flops': '2 * M * K',
    'bytes': '4 * (M * K + K + M)',
    'families': ['gemm'],
    'small': {'M': 64, 'K': 48},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, x):
        return torch.matmul(A, x)


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, 1)]


def get_init_inputs():
    return []
