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

}  // namespace alloy
