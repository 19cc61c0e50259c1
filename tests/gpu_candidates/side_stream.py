"""Cheat: computes on a private stream and returns without joining it."""
import torch

from cuforge.runtime import compile_cuda

SRC = r"""
extern "C" __global__ void relu(const float* x, float* y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f);
}
"""
_kernel = compile_cuda(SRC).kernel("relu")


class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.side = torch.cuda.Stream()

    def forward(self, x):
        y = torch.empty_like(x)
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            _kernel(((x.numel() + 255) // 256,), (256,), x, y, x.numel())
        return y
