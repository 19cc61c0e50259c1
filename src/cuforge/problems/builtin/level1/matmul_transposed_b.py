"""C = A @ B.T where B is stored N x K."""
import torch
import torch.nn as nn
import torch.nn.functional as F

M, K, N = 4096, 4096, 4096

CUFORGE = {
    'description': 'fp32 matmul with transposed B',
    'dtype': 'float32',
    'flops': '2 * M * N * K',
    'bytes': '4 * (M * K + K * N + M * N)',
    'families': ['gemm'],
    'small': {'M': 40, 'K': 24, 'N': 32},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.matmul(A, B.T)


def get_inputs():
    return [torch.randn(M, K), torch.randn(N, K)]


def get_init_inputs():
    return []
