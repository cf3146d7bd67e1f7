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

// Rows [row_begin, row_end) of a (vocabulary slice, C) table's gradient: row id - first_id gets
// dout[n] for every position n whose id falls there. dwte_rows: (row_end - row_begin, C) +=.
void embedding_backward_token_rows(float* dwte_rows, const float* dout, const int32_t* tokens,
                                   int64_t N, int C, int64_t first_id, int64_t row_begin,
                                   int64_t row_end);

// Rows [row_begin, row_end) of the learned positions' gradient: row t gets dout[b, t] for every b.
// dwpe_rows: (row_end - row_begin, C) +=.
void embedding_backward_position_rows(float* dwpe_rows, const float* dout, int B, int T, int C,
                                      int64_t row_begin, int64_t row_end);

}  // namespace alloy
