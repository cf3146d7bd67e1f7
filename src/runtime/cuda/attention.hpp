// Fused causal attention on the GPU (flash-style: tiles of queries against tiles of keys with an
// online softmax on tensor cores; the (T, T) scores are never stored), forward and backward, for
// multi-head and grouped-query attention with head_dim 64 or 128.
//
// qkv rows hold all query heads, then the key heads, then the value heads, as on the CPU:
//   qkv: (B, T, R) with R = (Hq + 2 Hkv) D; query head h reads key/value head h / (Hq / Hkv).
// Scores are scaled by 1 / sqrt(D).
//
// The environment variable ALLOY_CUDA_ATTENTION picks the kernels behind these functions: unset,
// empty or "fast" runs the fused tensor-core kernels (attention_forward.cu, attention_backward.cu);
// "reference" runs the plain fp32 kernels of attention_reference.hpp instead (slow, obviously
// correct: a fallback should the fast path ever be suspect); any other value throws alloy::Error.
// Pointers must be 16-byte aligned (cudaMalloc's are) for the fast kernels' vector loads.
#pragma once

#include <cstdint>

#include "runtime/cuda/cuda_check.hpp"

namespace alloy {

// Throws alloy::Error (naming head_dim and the supported values) when D is not supported.
void cuda_attention_check_shape(int Hq, int Hkv, int D);

// qkv: (B, T, R) -> out: (B, T, Hq D), lse: (B, Hq, T) the log-sum-exp of each query's scaled
// scores, kept for the backward.
void cuda_attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int Hq, int Hkv, int D,
                            cudaStream_t stream);

// Bytes of device workspace cuda_attention_backward needs for these sizes.
int64_t cuda_attention_backward_workspace_bytes(int B, int T, int Hq, int Hkv, int D);

// dout: (B, T, Hq D) -> dqkv: (B, T, R) OVERWRITTEN with the gradients of q, k and v. out and lse
// as left by cuda_attention_forward; workspace: cuda_attention_backward_workspace_bytes bytes,
// 256-byte aligned.
void cuda_attention_backward(bf16* dqkv, void* workspace, const bf16* dout, const bf16* qkv, const bf16* out,
                             const float* lse, int B, int T, int Hq, int Hkv, int D, cudaStream_t stream);

}  // namespace alloy
