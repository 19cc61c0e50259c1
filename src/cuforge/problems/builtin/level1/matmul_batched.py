"""C[b] = A[b] @ B[b], batched fp32 matmul."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, M, K, N = 32, 1024, 1024, 1024

CUFORGE = {
    'description': 'batched fp32 matmul',
    'dtype': 'float32',
    'flops': '2 * BATCH * M * N * K',
    'bytes': '4 * BATCH * (M * K + K * N + M * N)',
    'families': ['gemm'],
    'small': {'BATCH': 3, 'M': 32, 'K': 16, 'N': 24},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.bmm(A, B)


def get_inputs():
    return [torch.randn(BATCH, M, K), torch.randn(BATCH, K, N)]


def get_init_inputs():
    return []
