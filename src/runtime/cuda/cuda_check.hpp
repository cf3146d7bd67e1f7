// Error handling and element types shared by the CUDA backend: every CUDA, cuBLAS and NCCL status
// becomes an alloy::Error that names the call that failed and what to do about it.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace alloy {

using bf16 = __nv_bfloat16;

// Throws alloy::Error("<what>: <CUDA's message>") unless status is cudaSuccess.
void cuda_check(cudaError_t status, const char* what);
// The same for cuBLAS / cuBLASLt statuses.
void cublas_check(cublasStatus_t status, const char* what);
// Throws if the last kernel launch failed (bad configuration, no device code for this GPU).
void cuda_check_launch(const char* kernel);

// Blocks per grid for n items at `threads` items per block (n >= 0).
inline int cuda_blocks(int64_t n, int threads) { return static_cast<int>((n + threads - 1) / threads); }

}  // namespace alloy
