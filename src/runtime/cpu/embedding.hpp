// Token and learned-position embedding kernels (fp32, CPU).
#pragma once

#include <cstdint>

namespace alloy {

// tokens: (B, T)  wte: (V, C)  wpe: (max_seq_len, C) or nullptr (no learned positions)
//   -> out: (B, T, C) = wte[tokens] (+ wpe[t]). Token ids must already be checked < V.
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int B, int T, int C);

// dout: (B, T, C) -> dwte: (V, C) +=, dwpe: (max_seq_len, C) += (skipped when nullptr)
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int B, int T, int C);

}  // namespace alloy
