"""Library compute hidden from aten: cuBLASLt called through ctypes (caught by kernel names)."""
import torch

from cuforge.sandbox.judge.baselines import CublasLt


class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.plan = None

    def forward(self, A, B):
        if self.plan is None:
            self.plan = CublasLt(A.shape[0], B.shape[1], A.shape[1], A.dtype, A.device)
        return self.plan.run(A, B)
