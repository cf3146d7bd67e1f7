// Embedding lookup and its scatter-add backward.
#include "runtime/cpu/embedding.hpp"
#include "runtime/cpu/parallel.hpp"
#include "runtime/profile.hpp"

namespace alloy {

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int B, int T, int C) {
  ProfileScope profile(KernelKind::KernelKind_embedding);
  const int64_t rows = static_cast<int64_t>(B) * T;
#pragma omp parallel for schedule(static) if (rows * C >= kParallelMinElements)
  for (int64_t bt = 0; bt < rows; bt++) {
    const float* token_row = wte + static_cast<int64_t>(tokens[bt]) * C;
    float* out_row = out + bt * C;
    if (wpe != nullptr) {
      const float* position_row = wpe + (bt % T) * C;
      for (int c = 0; c < C; c++) out_row[c] = token_row[c] + position_row[c];
    } else {
      for (int c = 0; c < C; c++) out_row[c] = token_row[c];
    }
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int B, int T, int C) {
  ProfileScope profile(KernelKind::KernelKind_embedding);
  // Serial: several positions may hold the same token, and the work is tiny next to the GEMMs.
  const int64_t rows = static_cast<int64_t>(B) * T;
  for (int64_t bt = 0; bt < rows; bt++) {
    const float* g = dout + bt * C;
    float* token_row = dwte + static_cast<int64_t>(tokens[bt]) * C;
    for (int c = 0; c < C; c++) token_row[c] += g[c];
    if (dwpe != nullptr) {
      float* position_row = dwpe + (bt % T) * C;
      for (int c = 0; c < C; c++) position_row[c] += g[c];
    }
  }
}

void embedding_backward_token_rows(float* dwte_rows, const float* dout, const int32_t* tokens,
                                   int64_t N, int C, int64_t first_id, int64_t row_begin,
                                   int64_t row_end) {
  ProfileScope profile(KernelKind::KernelKind_embedding);
  for (int64_t n = 0; n < N; n++) {
    const int64_t row = tokens[n] - first_id;
    if (row < row_begin || row >= row_end) continue;
    const float* g = dout + n * C;
    float* token_row = dwte_rows + (row - row_begin) * C;
    for (int c = 0; c < C; c++) token_row[c] += g[c];
  }
}

void embedding_backward_position_rows(float* dwpe_rows, const float* dout, int B, int T, int C,
                                      int64_t row_begin, int64_t row_end) {
  ProfileScope profile(KernelKind::KernelKind_embedding);
  for (int64_t bt = 0; bt < int64_t{B} * T; bt++) {
    const int64_t t = bt % T;
    if (t < row_begin || t >= row_end) continue;
    const float* g = dout + bt * C;
    float* position_row = dwpe_rows + (t - row_begin) * C;
    for (int c = 0; c < C; c++) position_row[c] += g[c];
  }
}

}  // namespace alloy
