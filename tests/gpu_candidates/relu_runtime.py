"""An honest fp32 ReLU with the fast runtime: float4 loads and stores."""
import torch

from cuforge.runtime import compile_cuda

SRC = r"""
extern "C" __global__ void relu4(const float4* __restrict__ x, float4* __restrict__ y, long long n4) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n4) {
        float4 v = x[i];
        v.x = fmaxf(v.x, 0.f); v.y = fmaxf(v.y, 0.f); v.z = fmaxf(v.z, 0.f); v.w = fmaxf(v.w, 0.f);
        y[i] = v;
    }
}
"""
_kernel = compile_cuda(SRC).kernel("relu4")


class ModelNew(torch.nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        n4 = x.numel() // 4
        _kernel(((n4 + 255) // 256,), (256,), x, y, n4)
        return y
