"""A kernel that writes through a wild pointer: a sticky CUDA error."""
import torch

from cuforge.runtime import compile_cuda

_kernel = compile_cuda(r"""
extern "C" __global__ void wild(float* y) { ((float*)0x10)[threadIdx.x] = y[0]; }
""").kernel("wild")


class ModelNew(torch.nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        _kernel((1,), (32,), y)
        return y
