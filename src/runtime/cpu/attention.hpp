// Causal multi-head and grouped-query attention, and rotary position embedding (RoPE, the
// rotate-half convention of Hugging Face LLaMA), fp32 on CPU.
//
// qkv rows hold all query heads, then the key heads, then the value heads:
//   qkv: (B, T, R) with R = (Hq + 2 Hkv) D; query head h reads key/value head h / (Hq / Hkv).
#pragma once

#include <cstdint>
#include <vector>

namespace alloy {

// theta^(-2i/D) for the D/2 rotated pairs: unscaled RoPE (model_rope_inverse_frequencies gives a
// model's, scaled as its config says).
std::vector<double> rope_inverse_frequencies(int D, double theta);

// In place on the q and k heads of qkv: (B, T, R); position t rotates pairs (i, i + D/2) by
// t * inverse_frequencies[i] (D/2 of them). The v heads are untouched.
void rope_forward(float* qkv, int B, int T, int Hq, int Hkv, int D, const double* inverse_frequencies);
// dqkv: (B, T, R), in place: rotates the q and k gradients back (the transpose of forward).
void rope_backward(float* dqkv, int B, int T, int Hq, int Hkv, int D, const double* inverse_frequencies);

// qkv: (B, T, R) -> out: (B, T, Hq D), probs: (B, Hq, T, T) softmax(q k^T / sqrt(D)) with the
// causal mask (entries above the diagonal are 0) and, with window > 0, a sliding window: row t
// sees columns t - window + 1 .. t only.
void attention_forward(float* out, float* probs, const float* qkv, int B, int T, int Hq, int Hkv,
                       int D, int window = 0);

// Floats of scratch attention_backward needs: one (T, T) block per OpenMP thread.
int64_t attention_backward_scratch_floats(int T);

// dout: (B, T, Hq D) -> dqkv: (B, T, R) +=. probs and qkv as left by attention_forward (with the
// same window).
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* probs,
                        const float* qkv, int B, int T, int Hq, int Hkv, int D, int window = 0);

}  // namespace alloy
