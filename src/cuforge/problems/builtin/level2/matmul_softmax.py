"""softmax(Q @ K^T * SCALE, dim=-1), batched fp16 attention scores. FLOPs: 2BLLD + 6 per score."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, SEQ, HEAD_DIM = 128, 1024, 128
SCALE = HEAD_DIM ** -0.5

CUFORGE = {
    'description': 'scaled scores + softmax, fp16',
    'dtype': 'float16',
    'flops': '2 * BATCH * SEQ * SEQ * HEAD_DIM + 6 * BATCH * SEQ * SEQ',
    'bytes': '2 * (2 * BATCH * SEQ * HEAD_DIM + BATCH * SEQ * SEQ)',
    'families': ['gemm', 'softmax', 'fused'],
    'small': {'BATCH': 3, 'SEQ': 40, 'HEAD_DIM': 16},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False

    def forward(self, q, k):
        return torch.softmax(torch.bmm(q, k.transpose(1, 2)) * SCALE, dim=-1)


def get_inputs():
    return [torch.randn(BATCH, SEQ, HEAD_DIM, dtype=torch.float16), torch.randn(BATCH, SEQ, HEAD_DIM, dtype=torch.float16)]


def get_init_inputs():
    return []
