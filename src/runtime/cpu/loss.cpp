// Cross-entropy with a per-row log-sum-exp (max-subtracted, accumulated in double).
#include "runtime/cpu/loss.hpp"
#include "runtime/cpu/parallel.hpp"

#include <cmath>

namespace alloy {

float crossentropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets,
                           int N, int V) {
  double total = 0.0;
#pragma omp parallel for schedule(static) if (int64_t{N} * V >= kParallelMinElements) reduction(+ : total)
  for (int n = 0; n < N; n++) {
    const float* row = logits + static_cast<int64_t>(n) * V;
    float max_value = row[0];
    for (int v = 1; v < V; v++) max_value = row[v] > max_value ? row[v] : max_value;
    float sum = 0.0f;
    for (int v = 0; v < V; v++) sum += std::exp(row[v] - max_value);
    lse[n] = max_value + std::log(sum);
    losses[n] = lse[n] - row[targets[n]];
    total += losses[n];
  }
  return static_cast<float>(total / N);
}

void crossentropy_backward_inplace(float* logits, const float* lse, const int32_t* targets, int N,
                                   int V, float dloss) {
#pragma omp parallel for schedule(static) if (int64_t{N} * V >= kParallelMinElements)
  for (int n = 0; n < N; n++) {
    float* row = logits + static_cast<int64_t>(n) * V;
    const float shift = lse[n];
    for (int v = 0; v < V; v++) row[v] = std::exp(row[v] - shift) * dloss;
    row[targets[n]] -= dloss;
  }
}

}  // namespace alloy
