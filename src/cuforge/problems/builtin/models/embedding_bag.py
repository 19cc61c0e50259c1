"""A recommendation model's sparse feature: sum-pooled bags of rows from a 100000 x 128 embedding
table, 4096 bags of 20 lookups each."""
import torch
import torch.nn as nn

ROWS, DIM, BAGS, PER_BAG = 100000, 128, 4096, 20

CUFORGE = {
    'description': 'EmbeddingBag, sum mode',
    'dtype': 'float32',
    'dtypes': ['fp32', 'bf16', 'fp16'],
    'flops': 'BAGS * PER_BAG * DIM',
    # The table's rows count once each: a row named again is read from L2. Random indices name about
    # ROWS * (1 - exp(-lookups / ROWS)) distinct rows; nine tenths of that keeps the floor below any
    # draw's (an honest kernel that reads each distinct row once must never be called impossible).
    'bytes': '4 * (0.9 * ROWS * (1 - math.exp(-BAGS * PER_BAG / ROWS)) * DIM + BAGS * DIM) + 8 * (BAGS * PER_BAG + BAGS)',
    'families': ['reduction'],
    'policy': 'mixed',
    'small': {'ROWS': 50, 'DIM': 8, 'BAGS': 4, 'PER_BAG': 3},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(ROWS, DIM, mode="sum")

    def forward(self, indices, offsets):
        return self.bag(indices, offsets)


def get_inputs():
    return [torch.randint(0, ROWS, (BAGS * PER_BAG,)), torch.arange(0, BAGS * PER_BAG, PER_BAG)]


def get_init_inputs():
    return []
