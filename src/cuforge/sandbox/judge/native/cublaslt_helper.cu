// cuBLASLt baseline for row-major C[M,N] = A[M,K] @ B[K,N], fp32 accumulation.
// Row-major C = A B is column-major C^T = B^T A^T, so B is passed as the first operand.
// Built by cuforge on first use (nvcc -shared) and loaded with ctypes.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stddef.h>

namespace {
constexpr int kMaxAlgos = 64;
struct Plan {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulHeuristicResult_t results[kMaxAlgos];
  int count = 0;
  void* workspace = nullptr;
  size_t workspace_size = 0;
};
}  // namespace

extern "C" int cuforge_lt_create(int M, int N, int K, int dtype, void* workspace, size_t workspace_size,
                                 int max_algos, void** out_plan) {
  cudaDataType_t t = dtype == 0 ? CUDA_R_16F : (dtype == 1 ? CUDA_R_16BF : CUDA_R_32F);
  Plan* p = new Plan();
  p->workspace = workspace;
  p->workspace_size = workspace_size;
  cublasStatus_t s = cublasLtCreate(&p->handle);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(&p->a, t, N, K, N);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(&p->b, t, K, M, K);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(&p->c, t, N, M, N);
  cublasLtMatmulPreference_t pref = nullptr;
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulPreferenceCreate(&pref);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_size,
                                             sizeof(workspace_size));
  if (max_algos > kMaxAlgos) max_algos = kMaxAlgos;
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatmulAlgoGetHeuristic(p->handle, p->desc, p->a, p->b, p->c, p->c, pref, max_algos, p->results,
                                       &p->count);
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  *out_plan = p;
  return static_cast<int>(s);
}

extern "C" int cuforge_lt_count(void* plan) { return static_cast<Plan*>(plan)->count; }

extern "C" int cuforge_lt_run(void* plan, int algo, const void* A, const void* B, void* C, void* stream) {
  Plan* p = static_cast<Plan*>(plan);
  if (algo < 0 || algo >= p->count) return -1;
  const float alpha = 1.0f, beta = 0.0f;
  return static_cast<int>(cublasLtMatmul(p->handle, p->desc, &alpha, B, p->a, A, p->b, &beta, C, p->c, C, p->c,
                                         &p->results[algo].algo, p->workspace, p->workspace_size,
                                         static_cast<cudaStream_t>(stream)));
}

extern "C" void cuforge_lt_destroy(void* plan) {
  Plan* p = static_cast<Plan*>(plan);
  if (p->a) cublasLtMatrixLayoutDestroy(p->a);
  if (p->b) cublasLtMatrixLayoutDestroy(p->b);
  if (p->c) cublasLtMatrixLayoutDestroy(p->c);
  if (p->desc) cublasLtMatmulDescDestroy(p->desc);
  if (p->handle) cublasLtDestroy(p->handle);
  delete p;
}
