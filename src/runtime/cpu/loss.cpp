// Cross-entropy with a per-row log-sum-exp (max-subtracted); rows in parallel, vocabulary
// loops vectorised.
// Partial redundancy elimination turns exp_fast's clamps into branches that stop the `omp simd`
// loops from vectorising (GCC 12, -O2); this file's kernels are faster without it.
#pragma GCC optimize("no-tree-pre")

#include "runtime/cpu/loss.hpp"
#include "runtime/cpu/fastmath.hpp"
#include "runtime/cpu/parallel.hpp"
#include "runtime/profile.hpp"

#include <cmath>

namespace alloy {

float crossentropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets,
                           int N, int V) {
  ProfileScope profile(KernelKind::KernelKind_loss);
  double total = 0.0;
#pragma omp parallel for schedule(static) if (int64_t{N} * V >= kParallelMinElements) reduction(+ : total)
  for (int n = 0; n < N; n++) {
    const float* row = logits + static_cast<int64_t>(n) * V;
    float max_value = row[0];
#pragma omp simd reduction(max : max_value)
    for (int v = 0; v < V; v++) max_value = row[v] > max_value ? row[v] : max_value;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int v = 0; v < V; v++) sum += exp_fast(row[v] - max_value);
    lse[n] = max_value + std::log(sum);
    losses[n] = lse[n] - row[targets[n]];
    total += losses[n];
  }
  return static_cast<float>(total / N);
}

void crossentropy_backward_inplace(float* logits, const float* lse, const int32_t* targets, int N,
                                   int V, float dloss) {
  ProfileScope profile(KernelKind::KernelKind_loss);
#pragma omp parallel for schedule(static) if (int64_t{N} * V >= kParallelMinElements)
  for (int n = 0; n < N; n++) {
    float* row = logits + static_cast<int64_t>(n) * V;
    const float shift = lse[n];
#pragma omp simd
    for (int v = 0; v < V; v++) row[v] = exp_fast(row[v] - shift) * dloss;
    row[targets[n]] -= dloss;
  }
}

}  // namespace alloy
