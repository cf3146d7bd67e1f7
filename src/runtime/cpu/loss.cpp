// Cross-entropy with a per-row log-sum-exp (max-subtracted); rows in parallel, vocabulary loops
// vectorised (AVX2+FMA clone where the CPU has it).
#include "runtime/cpu/loss.hpp"

// Partial redundancy elimination turns exp_fast's clamps into branches that stop the `omp simd`
// loops from vectorising (GCC 12, -O2); this file's kernels are faster without it.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-tree-pre")
#endif

#include <cmath>

#include "runtime/cpu/fastmath.hpp"
#include "runtime/cpu/parallel.hpp"
#include "runtime/profile.hpp"

namespace alloy {

namespace {

// row: (V) -> max(row)
ALLOY_VECTOR_CLONES
float row_max(const float* row, int V) {
  float max_value = row[0];
#pragma omp simd reduction(max : max_value)
  for (int v = 0; v < V; v++) max_value = row[v] > max_value ? row[v] : max_value;
  return max_value;
}

// row: (V) -> sum(exp(row - shift))
ALLOY_VECTOR_CLONES
float exp_sum(const float* row, int V, float shift) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int v = 0; v < V; v++) sum += exp_fast(row[v] - shift);
  return sum;
}

// row: (V) -> log(sum(exp(row)))
float log_sum_exp(const float* row, int V) {
  const float max_value = row_max(row, V);
  return max_value + std::log(exp_sum(row, V, max_value));
}

// row: (V) -> exp(row - shift) * scale, in place
ALLOY_VECTOR_CLONES
void exp_scale_row(float* row, int V, float shift, float scale) {
#pragma omp simd
  for (int v = 0; v < V; v++) row[v] = exp_fast(row[v] - shift) * scale;
}

}  // namespace

float crossentropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets,
                           int N, int V) {
  ProfileScope profile(KernelKind::KernelKind_loss);
  double total = 0.0;
  const bool parallel = int64_t{N} * V >= kParallelMinElements;
#pragma omp parallel for schedule(static) if (parallel) reduction(+ : total)
  for (int n = 0; n < N; n++) {
    const float* row = logits + static_cast<int64_t>(n) * V;
    lse[n] = log_sum_exp(row, V);
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
    exp_scale_row(row, V, lse[n], dloss);
    row[targets[n]] -= dloss;
  }
}

void crossentropy_slice_maxima(float* maxima, const float* logits, int N, int V) {
  ProfileScope profile(KernelKind::KernelKind_loss);
#pragma omp parallel for schedule(static) if (int64_t{N} * V >= kParallelMinElements)
  for (int n = 0; n < N; n++) maxima[n] = row_max(logits + static_cast<int64_t>(n) * V, V);
}

void crossentropy_slice_sums(float* sums, float* target_logits, const float* logits, const float* maxima,
                             const int32_t* targets, int64_t vocab_begin, int N, int V) {
  ProfileScope profile(KernelKind::KernelKind_loss);
#pragma omp parallel for schedule(static) if (int64_t{N} * V >= kParallelMinElements)
  for (int n = 0; n < N; n++) {
    const float* row = logits + static_cast<int64_t>(n) * V;
    sums[n] = exp_sum(row, V, maxima[n]);
    const int64_t local = targets[n] - vocab_begin;
    target_logits[n] = local >= 0 && local < V ? row[local] : 0.0f;
  }
}

void crossentropy_slice_backward_inplace(float* logits, const float* lse, const int32_t* targets, int64_t vocab_begin,
                                         int N, int V, float dloss) {
  ProfileScope profile(KernelKind::KernelKind_loss);
#pragma omp parallel for schedule(static) if (int64_t{N} * V >= kParallelMinElements)
  for (int n = 0; n < N; n++) {
    float* row = logits + static_cast<int64_t>(n) * V;
    exp_scale_row(row, V, lse[n], dloss);
    const int64_t local = targets[n] - vocab_begin;
    if (local >= 0 && local < V) row[local] -= dloss;
  }
}

}  // namespace alloy
