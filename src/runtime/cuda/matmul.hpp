// Linear layers on the GPU through cuBLASLt: bf16 inputs, fp32 accumulation. Weights are stored
// (out, in) row-major like the CPU backend's; activations are row-major (rows, features) with a
// leading dimension (elements between rows) that may exceed the feature count (padded logits).
#pragma once

#include <cstdint>
#include <map>
#include <array>

#include "runtime/cuda/cuda_check.hpp"

namespace alloy {

// One cuBLASLt handle with its workspace and the algorithms chosen per problem shape.
class CudaMatmul {
 public:
  CudaMatmul();
  ~CudaMatmul();
  CudaMatmul(const CudaMatmul&) = delete;
  CudaMatmul& operator=(const CudaMatmul&) = delete;

  // inp: (N, K) ld K, w: (M, K), b: (M) or nullptr, residual: (N, M) ld ldo or nullptr
  //   -> out: (N, M) ld ldo = inp w^T + b (+ residual). out may equal residual.
  void forward(bf16* out, const bf16* inp, const bf16* w, const bf16* b, const bf16* residual, int N, int K, int M,
               int ldo, cudaStream_t stream);
  // dout: (N, M) ld ldo, w: (M, K) -> dinp: (N, K) = dout w (accumulate: dinp += dout w).
  void backward_input(bf16* dinp, const bf16* dout, const bf16* w, int N, int K, int M, int ldo, bool accumulate,
                      cudaStream_t stream);
  // dout: (N, M) ld ldo, inp: (N, K) -> dw: (M, K) += dout^T inp (fp32).
  void backward_weight(float* dw, const bf16* dout, const bf16* inp, int N, int K, int M, int ldo,
                       cudaStream_t stream);

 private:
  // One D = alpha op(A) op(B) + beta C in cuBLASLt's column-major terms: A (m x k after op),
  // B (k x n after op), C and D (m x n, ld ldc); bias (m) added when given.
  struct Problem {
    bool transpose_a, transpose_b;
    int m, n, k, lda, ldb, ldc;
    cudaDataType_t c_type;
    bool bias;
    bool accumulate;
    int align_a, align_b, align_c, align_d;  // byte alignment of the pointers, at most 256
    using Key = std::array<int, 15>;
    Key key() const {
      return {transpose_a, transpose_b, m, n, k, lda, ldb, ldc, static_cast<int>(c_type), bias, accumulate,
              align_a, align_b, align_c, align_d};
    }
  };
  void run(const Problem& p, const void* a, const void* b, const void* c, void* d, const void* bias,
           cudaStream_t stream);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Problem::Key, cublasLtMatmulAlgo_t> algorithms_;
};

// Achieved bf16 matrix-product rate (FLOP/s) of cuBLASLt on (n, n) x (n, n)^T, best of `repeats`
// after a warm-up: the measured peak that model FLOPs utilisation is reported against.
double cuda_matmul_peak_flops(CudaMatmul& matmul, int n = 8192, int repeats = 10);

}  // namespace alloy
