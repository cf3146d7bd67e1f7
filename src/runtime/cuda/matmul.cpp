// cuBLASLt behind the GPU's linear layers: descriptors per call, algorithms cached per shape.
#include "runtime/cuda/matmul.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "spec/error.hpp"

namespace alloy {

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // Hopper kernels use up to 32 MiB

int pointer_alignment(const void* pointer) {
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  int alignment = 256;
  while (alignment > 1 && address % static_cast<uintptr_t>(alignment) != 0) alignment /= 2;
  return alignment;
}

// Owns one cuBLASLt descriptor of type T until scope end.
template <typename T, cublasStatus_t (*Destroy)(T)>
struct Owned {
  T value = nullptr;
  ~Owned() {
    if (value != nullptr) Destroy(value);
  }
};

}  // namespace

CudaMatmul::CudaMatmul() {
  cublas_check(cublasLtCreate(&handle_), "creating the cuBLASLt handle");
  cuda_check(cudaMalloc(&workspace_, kWorkspaceBytes), "allocating the cuBLASLt workspace");
  workspace_bytes_ = kWorkspaceBytes;
}

CudaMatmul::~CudaMatmul() {
  cudaFree(workspace_);
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

void CudaMatmul::run(const Problem& p, const void* a, const void* b, const void* c, void* d, const void* bias,
                     cudaStream_t stream) {
  Owned<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy> desc;
  cublas_check(cublasLtMatmulDescCreate(&desc.value, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cuBLASLt matmul descriptor");
  const cublasOperation_t op_a = p.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = p.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublas_check(cublasLtMatmulDescSetAttribute(desc.value, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)), "transa");
  cublas_check(cublasLtMatmulDescSetAttribute(desc.value, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)), "transb");
  if (bias != nullptr) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bias_type = CUDA_R_16BF;
    cublas_check(cublasLtMatmulDescSetAttribute(desc.value, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)),
                 "bias epilogue");
    cublas_check(cublasLtMatmulDescSetAttribute(desc.value, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
                 "bias pointer");
    cublas_check(
        cublasLtMatmulDescSetAttribute(desc.value, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)),
        "bias type");
  }
  // Stored shapes (before op): A is (k x m) when transposed, else (m x k); likewise B.
  Owned<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy> la, lb, lc;
  cublas_check(cublasLtMatrixLayoutCreate(&la.value, CUDA_R_16BF, p.transpose_a ? p.k : p.m,
                                          p.transpose_a ? p.m : p.k, p.lda),
               "layout A");
  cublas_check(cublasLtMatrixLayoutCreate(&lb.value, CUDA_R_16BF, p.transpose_b ? p.n : p.k,
                                          p.transpose_b ? p.k : p.n, p.ldb),
               "layout B");
  cublas_check(cublasLtMatrixLayoutCreate(&lc.value, p.c_type, p.m, p.n, p.ldc), "layout C");

  auto found = algorithms_.find(p.key());
  if (found == algorithms_.end()) {
    Owned<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy> pref;
    cublas_check(cublasLtMatmulPreferenceCreate(&pref.value), "cuBLASLt preference");
    cublas_check(cublasLtMatmulPreferenceSetAttribute(pref.value, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &workspace_bytes_, sizeof(workspace_bytes_)),
                 "workspace preference");
    const std::pair<cublasLtMatmulPreferenceAttributes_t, int> alignments[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, p.align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, p.align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, p.align_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, p.align_d}};
    for (const auto& [attribute, bytes] : alignments) {
      const uint32_t value = static_cast<uint32_t>(bytes);
      cublas_check(cublasLtMatmulPreferenceSetAttribute(pref.value, attribute, &value, sizeof(value)),
                   "alignment preference");
    }
    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    cublas_check(cublasLtMatmulAlgoGetHeuristic(handle_, desc.value, la.value, lb.value, lc.value, lc.value, pref.value,
                                                1, &result, &count),
                 "cuBLASLt algorithm search");
    if (count == 0) {
      throw Error(fmt::format("cuBLASLt has no algorithm for a {}x{}x{} product (lda {}, ldb {}, ldc {})", p.m, p.n,
                              p.k, p.lda, p.ldb, p.ldc),
                  {}, "report this shape; padding the feature sizes to multiples of 8 usually avoids it");
    }
    found = algorithms_.emplace(p.key(), result.algo).first;
  }
  const float alpha = 1.0f;
  const float beta = p.accumulate ? 1.0f : 0.0f;
  cublas_check(cublasLtMatmul(handle_, desc.value, &alpha, a, la.value, b, lb.value, &beta, c, lc.value, d, lc.value,
                              &found->second, workspace_, workspace_bytes_, stream),
               "cuBLASLt matmul");
}

// Row-major out (N, M) is column-major (M x N): out = w^T-as-stored (M x K) times inp (K x N).
void CudaMatmul::forward(bf16* out, const bf16* inp, const bf16* w, const bf16* b, const bf16* residual, int N, int K,
                         int M, int ldo, cudaStream_t stream) {
  Problem p{true, false, M, N, K, K, K, ldo, CUDA_R_16BF, b != nullptr, residual != nullptr,
            pointer_alignment(w), pointer_alignment(inp), pointer_alignment(residual != nullptr ? residual : out),
            pointer_alignment(out)};
  run(p, w, inp, residual != nullptr ? residual : out, out, b, stream);
}

// dinp (N, K) is column-major (K x N) = w (K x M column-major) times dout (M x N).
void CudaMatmul::backward_input(bf16* dinp, const bf16* dout, const bf16* w, int N, int K, int M, int ldo,
                                bool accumulate, cudaStream_t stream) {
  Problem p{false, false, K, N, M, K, ldo, K, CUDA_R_16BF, false, accumulate,
            pointer_alignment(w), pointer_alignment(dout), pointer_alignment(dinp), pointer_alignment(dinp)};
  run(p, w, dout, dinp, dinp, nullptr, stream);
}

// dw (M, K) is column-major (K x M) = inp (K x N) times dout^T (N x M).
void CudaMatmul::backward_weight(float* dw, const bf16* dout, const bf16* inp, int N, int K, int M, int ldo,
                                 cudaStream_t stream) {
  Problem p{false, true, K, M, N, K, ldo, K, CUDA_R_32F, false, true,
            pointer_alignment(inp), pointer_alignment(dout), pointer_alignment(dw), pointer_alignment(dw)};
  run(p, inp, dout, dw, dw, nullptr, stream);
}

double cuda_matmul_peak_flops(CudaMatmul& matmul, int n, int repeats) {
  const size_t elements = static_cast<size_t>(n) * n;
  bf16 *a = nullptr, *b = nullptr, *c = nullptr;
  cuda_check(cudaMalloc(&a, elements * sizeof(bf16)), "peak test buffers");
  cuda_check(cudaMalloc(&b, elements * sizeof(bf16)), "peak test buffers");
  cuda_check(cudaMalloc(&c, elements * sizeof(bf16)), "peak test buffers");
  // Small non-zero values: products of zeros run faster than real data does.
  std::vector<bf16> host(elements);
  for (size_t i = 0; i < elements; ++i) host[i] = __float2bfloat16(static_cast<float>((i * 2654435761u) % 17) * 0.01f);
  cuda_check(cudaMemcpy(a, host.data(), elements * sizeof(bf16), cudaMemcpyHostToDevice), "peak test upload");
  cuda_check(cudaMemcpy(b, host.data(), elements * sizeof(bf16), cudaMemcpyHostToDevice), "peak test upload");
  cudaEvent_t start, stop;
  cuda_check(cudaEventCreate(&start), "event");
  cuda_check(cudaEventCreate(&stop), "event");
  matmul.forward(c, a, b, nullptr, nullptr, n, n, n, n, nullptr);
  double best_seconds = 1e30;
  for (int r = 0; r < repeats; ++r) {
    cuda_check(cudaEventRecord(start, nullptr), "event");
    matmul.forward(c, a, b, nullptr, nullptr, n, n, n, n, nullptr);
    cuda_check(cudaEventRecord(stop, nullptr), "event");
    cuda_check(cudaEventSynchronize(stop), "peak test");
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, start, stop), "event time");
    best_seconds = std::min(best_seconds, ms * 1e-3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return 2.0 * n * static_cast<double>(n) * n / best_seconds;
}

}  // namespace alloy
