// Elementwise kernels of the blocks: GELU (tanh approximation, GPT-2's "gelu_new"), SwiGLU
// (silu(gate) * up) and the residual add (fp32, CPU).
#pragma once

#include <cstdint>

namespace alloy {

// inp: (n) -> out: (n) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
void gelu_forward(float* out, const float* inp, int64_t n);
// dout: (n) -> dinp: (n) +=
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n);

// inp: (N, 2F), each row [gate (F), up (F)] -> out: (N, F) = silu(gate) * up
void swiglu_forward(float* out, const float* inp, int64_t N, int F);
// dout: (N, F) -> dinp: (N, 2F) +=
void swiglu_backward(float* dinp, const float* inp, const float* dout, int64_t N, int F);

// a, b: (n) -> out: (n) = a + b
void residual_forward(float* out, const float* a, const float* b, int64_t n);
// dout: (n) -> da: (n) +=, db: (n) +=
void residual_backward(float* da, float* db, const float* dout, int64_t n);

}  // namespace alloy
