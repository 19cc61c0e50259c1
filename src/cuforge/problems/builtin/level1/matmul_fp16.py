"""C = A @ B in fp16 with fp32 accumulation."""
import torch
import torch.nn as nn
import torch.nn.functional as F

N = 8192

CUFORGE = {
    'description': 'square fp16 matmul, fp32 accumulation',
    'dtype': 'float16',
    'flops': '2 * N**3',
    'bytes': '2 * 3 * N * N',
    'families': ['gemm'],
    'small': {'N': 64},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False

    def forward(self, A, B):
        return torch.matmul(A, B)


def get_inputs():
    return [torch.randn(N, N, dtype=torch.float16), torch.randn(N, N, dtype=torch.float16)]


def get_init_inputs():
    return []
