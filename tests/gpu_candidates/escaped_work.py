"""Cheat: honest during the correctness trials, then moves its work to a private stream."""
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
    calls = 0

    def __init__(self):
        super().__init__()
        self.side = torch.cuda.Stream()

    def forward(self, x):
        ModelNew.calls += 1
        y = torch.empty_like(x)
        grid = ((x.numel() + 255) // 256,)
        if ModelNew.calls <= 8:
            _kernel(grid, (256,), x, y, x.numel())
            return y
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            for _ in range(4):
                _kernel(grid, (256,), x, y, x.numel())
        return y
