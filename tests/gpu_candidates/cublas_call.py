"""Library compute under policy 'custom': cuBLAS through torch.matmul."""
import torch


class ModelNew(torch.nn.Module):
    def forward(self, A, B):
        return torch.matmul(A, B)
