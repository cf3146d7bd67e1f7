// The CUDA backend's kernels other than attention and matrix products, as host launchers on a
// stream. Activations and their gradients are bf16; weight gradients, norm statistics, losses and
// optimizer state are fp32; all arithmetic is fp32. Each mirrors a CPU kernel under
// src/runtime/cpu/ (same shapes, same formulas) unless it says otherwise.
#pragma once

#include <cstdint>

#include "runtime/cuda/cuda_check.hpp"

namespace alloy {

// tokens: (B, T) ids < V, wte: (V, C), wpe: (>= T, C) or nullptr -> out: (B, T, C) = wte[id] (+ wpe[t])
void cuda_embedding_forward(bf16* out, const int32_t* tokens, const bf16* wte, const bf16* wpe, int B, int T, int C,
                            cudaStream_t stream);
// dout: (B, T, C) -> dwte: (V, C) +=, dwpe: (>= T, C) += (skipped when nullptr); fp32 accumulation.
void cuda_embedding_backward(float* dwte, float* dwpe, const bf16* dout, const int32_t* tokens, int B, int T, int C,
                             cudaStream_t stream);

// inp: (N, C), w, b: (C) (b may be nullptr) -> out: (N, C), mean, rstd: (N)
void cuda_layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* w, const bf16* b, int N,
                            int C, float eps, cudaStream_t stream);
// dout: (N, C) -> dinp: (N, C) += (fp32 sum, rounded once to bf16), dw: (C) +=, db: (C) += (skipped when nullptr)
void cuda_layernorm_backward(bf16* dinp, float* dw, float* db, const bf16* dout, const bf16* inp, const bf16* w,
                             const float* mean, const float* rstd, int N, int C, cudaStream_t stream);
// inp: (N, C), w: (C) -> out: (N, C) = inp / rms(inp) * w, rstd: (N)
void cuda_rmsnorm_forward(bf16* out, float* rstd, const bf16* inp, const bf16* w, int N, int C, float eps,
                          cudaStream_t stream);
// dout: (N, C) -> dinp: (N, C) +=, dw: (C) +=
void cuda_rmsnorm_backward(bf16* dinp, float* dw, const bf16* dout, const bf16* inp, const bf16* w, const float* rstd,
                           int N, int C, cudaStream_t stream);

// GELU, tanh approximation. inp: (n) -> out: (n)
void cuda_gelu_forward(bf16* out, const bf16* inp, int64_t n, cudaStream_t stream);
// dout: (n) -> dinp: (n) OVERWRITTEN (not accumulated, unlike the CPU kernel); dinp may equal dout.
void cuda_gelu_backward(bf16* dinp, const bf16* inp, const bf16* dout, int64_t n, cudaStream_t stream);
// inp: (N, 2F), rows [gate (F), up (F)] -> out: (N, F) = silu(gate) * up
void cuda_swiglu_forward(bf16* out, const bf16* inp, int64_t N, int F, cudaStream_t stream);
// dout: (N, F) -> dinp: (N, 2F) OVERWRITTEN
void cuda_swiglu_backward(bf16* dinp, const bf16* inp, const bf16* dout, int64_t N, int F, cudaStream_t stream);
// a, b: (n) -> out: (n) = a + b (out may alias a or b)
void cuda_residual_forward(bf16* out, const bf16* a, const bf16* b, int64_t n, cudaStream_t stream);

// RoPE in place on the q and k heads of qkv: (B, T, (Hq + 2 Hkv) D), as the CPU rope_forward.
void cuda_rope_forward(bf16* qkv, int B, int T, int Hq, int Hkv, int D, float theta, cudaStream_t stream);
// dqkv: (B, T, (Hq + 2 Hkv) D) in place, as the CPU rope_backward.
void cuda_rope_backward(bf16* dqkv, int B, int T, int Hq, int Hkv, int D, float theta, cudaStream_t stream);

// dout: (N, M) -> db: (M) += column sums (fp32)
void cuda_bias_backward(float* db, const bf16* dout, int N, int M, cudaStream_t stream);

// Fused softmax cross-entropy. logits: (N, ld) of which columns [0, V) are the vocabulary
// (ld >= V, a multiple of 8); targets: (N) in [0, V). losses: (N) = logsumexp - logit[target].
// When backward: logits OVERWRITTEN with dloss * (softmax - onehot(target)) on [0, V) and 0 on
// [V, ld).
void cuda_crossentropy(bf16* logits, float* losses, const int32_t* targets, int N, int V, int ld, float dloss,
                       bool backward, cudaStream_t stream);
// *sum += x[0] + ... + x[n - 1] (sum: one double on the device, so the token losses of a whole
// step add up without fp32 rounding).
void cuda_sum(double* sum, const float* x, int64_t n, cudaStream_t stream);

// AdamW on n parameters, as the CPU optimizer: g = grads * grad_scale (clipping); m, v updated;
// params -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * params) with bias corrections for
// `step` (1-based); params_bf16 = the updated params rounded to bf16 (the compute copy).
void cuda_adamw_update(float* params, bf16* params_bf16, const float* grads, float* m, float* v, int64_t n, float lr,
                       float beta1, float beta2, float eps, float weight_decay, float grad_scale, int64_t step,
                       cudaStream_t stream);
// *sum += sum of x[i]^2 over n floats (sum: one float on the device).
void cuda_sum_squares(float* sum, const float* x, int64_t n, cudaStream_t stream);

// Mixture-of-Experts, as runtime/cpu/moe.hpp (routing weights, probabilities and their gradients
// fp32; rows bf16). E <= kCudaMoeMaxExperts (the router's backward keeps a token's E gradients in
// local memory).
inline constexpr int kCudaMoeMaxExperts = 256;
// logits: (N, E) -> probs: (N, E), expert: (N, K), weight: (N, K), as moe_route_forward.
void cuda_moe_route_forward(float* probs, int32_t* expert, float* weight, const bf16* logits, int N, int E, int K,
                            bool normalize, cudaStream_t stream);
// dweight: (N, K), aux_dprobs: (E) or nullptr -> dlogits: (N, E) OVERWRITTEN, as moe_route_backward.
void cuda_moe_route_backward(bf16* dlogits, const float* dweight, const float* aux_dprobs, const float* probs,
                             const int32_t* expert, const float* weight, int N, int E, int K, bool normalize,
                             cudaStream_t stream);
// x: (N, C), slots: (N K) -> xp: (N K, C), permuted row r = x[slots[r] / K].
void cuda_moe_gather(bf16* xp, const bf16* x, const int32_t* slots, int64_t NK, int K, int C, cudaStream_t stream);
// dxp: (N K, C), rows: (N K) the permuted row of each slot (moe_rows_of_slots) -> dx: (N, C) +=
// each token's K rows.
void cuda_moe_scatter_add(bf16* dx, const bf16* dxp, const int32_t* rows, int64_t N, int K, int C,
                          cudaStream_t stream);
// yp: (N K, C) permuted expert outputs, weight: (N, K), rows: (N K) -> out: (N, C) += weight * y.
void cuda_moe_combine_forward(bf16* out, const bf16* yp, const float* weight, const int32_t* rows, int64_t N, int K,
                              int C, cudaStream_t stream);
// dout: (N, C) -> dyp: (N K, C) = weight * dout, dweight: (N, K) = <dout, y>.
void cuda_moe_combine_backward(bf16* dyp, float* dweight, const bf16* dout, const bf16* yp, const float* weight,
                               const int32_t* rows, int64_t N, int K, int C, cudaStream_t stream);
// probs: (N, E) -> sums: (E) += the column sums (double).
void cuda_moe_prob_sums(double* sums, const float* probs, int N, int E, cudaStream_t stream);

void cuda_float_to_bf16(bf16* out, const float* in, int64_t n, cudaStream_t stream);
void cuda_bf16_to_float(float* out, const bf16* in, int64_t n, cudaStream_t stream);

}  // namespace alloy
