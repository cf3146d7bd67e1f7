// LayerNorm (GPT-2) and RMSNorm (LLaMA) kernels over the last axis (fp32, CPU).
#pragma once

namespace alloy {

// inp: (N, C)  w: (C)  b: (C) or nullptr  ->  out: (N, C), mean: (N), rstd: (N) kept for backward
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int N, int C, float eps);
// dout: (N, C) -> dinp: (N, C) +=, dw: (C) +=, db: (C) += (skipped when nullptr)
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int N, int C);

// inp: (N, C)  w: (C)  ->  out: (N, C) = inp / rms(inp) * w, rstd: (N) kept for backward
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                     float eps);
// dout: (N, C) -> dinp: (N, C) +=, dw: (C) +=
void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                      const float* rstd, int N, int C);

}  // namespace alloy
