// Tiled SIMT GEMM, C = A @ B, fp16 in/out, ACC accumulation. Handles any M, N, K.
#include <cuda_fp16.h>
extern "C" __global__ void hgemm_simt(const half* __restrict__ A, const half* __restrict__ B, half* __restrict__ C,
                                      int M, int N, int K) {
    __shared__ float As[16][17];
    __shared__ float Bs[16][17];
    int tx = threadIdx.x, ty = threadIdx.y;
    int row = blockIdx.y * 16 + ty, col = blockIdx.x * 16 + tx;
    ACC_T acc = ACC_ZERO;
    for (int k0 = 0; k0 < K; k0 += 16) {
        As[ty][tx] = (row < M && k0 + tx < K) ? __half2float(A[(long long)row * K + k0 + tx]) : 0.f;
        Bs[ty][tx] = (k0 + ty < K && col < N) ? __half2float(B[(long long)(k0 + ty) * N + col]) : 0.f;
        __syncthreads();
        #pragma unroll
        for (int k = 0; k < 16; ++k) acc = ACC_FMA(As[ty][k], Bs[k][tx], acc);
        __syncthreads();
    }
    if (row < M && col < N) C[(long long)row * N + col] = ACC_OUT(acc);
}
