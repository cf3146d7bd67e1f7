// Plain fp32 CUDA attention (one block per query row, no tensor cores, no tiling): the safety net
// behind the fused kernels of attention.hpp, with the same shapes and results up to rounding.
// cuda_attention_forward / cuda_attention_backward run these instead when the environment sets
// ALLOY_CUDA_ATTENTION=reference; the tests compare both paths against the CPU kernels.
#pragma once

#include <cstdint>

#include "runtime/cuda/cuda_check.hpp"

namespace alloy {

// As cuda_attention_forward: qkv: (B, T, (Hq + 2 Hkv) D) -> out: (B, T, Hq D), lse: (B, Hq, T).
void cuda_attention_reference_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int Hq, int Hkv, int D,
                                      cudaStream_t stream);

// Bytes of workspace cuda_attention_reference_backward needs: fp32 key and value gradients.
int64_t cuda_attention_reference_backward_workspace_bytes(int B, int T, int Hq, int Hkv, int D);

// As cuda_attention_backward: dqkv: (B, T, (Hq + 2 Hkv) D) OVERWRITTEN.
void cuda_attention_reference_backward(bf16* dqkv, void* workspace, const bf16* dout, const bf16* qkv, const bf16* out,
                                       const float* lse, int B, int T, int Hq, int Hkv, int D, cudaStream_t stream);

}  // namespace alloy
