// AdamW update, clipping and the learning-rate schedule.
#include "runtime/cpu/optimizer.hpp"

// sqrt may not set errno here (AdamW's v is never negative): lets the update loop vectorise.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-math-errno")
#endif

#include "runtime/cpu/fastmath.hpp"
#include "runtime/cpu/parallel.hpp"
#include "runtime/profile.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace alloy {

namespace {

ALLOY_VECTOR_CLONES
void adamw_range(float* params, float* m, float* v, const float* grads, int64_t n,
                 const AdamWHyper& hyper, float step_size, float inv_sqrt_correction2,
                 float decay) {
  const float b1 = hyper.beta1;
  const float b2 = hyper.beta2;
  const float eps = hyper.eps;
  const float grad_scale = hyper.grad_scale;
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    const float g = grads[i] * grad_scale;
    m[i] = b1 * m[i] + (1.0f - b1) * g;
    v[i] = b2 * v[i] + (1.0f - b2) * g * g;
    const float denom = std::sqrt(v[i]) * inv_sqrt_correction2 + eps;
    params[i] = params[i] * decay - step_size * m[i] / denom;
  }
}

ALLOY_VECTOR_CLONES
double sum_squares_range(const float* values, int64_t n) {
  double sum = 0.0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; i++) sum += static_cast<double>(values[i]) * values[i];
  return sum;
}

}  // namespace

void adamw_update(float* params, float* m, float* v, const float* grads, int64_t n,
                  const AdamWHyper& hyper, int64_t step) {
  ProfileScope profile(KernelKind::KernelKind_optimizer);
  const double correction1 = 1.0 - std::pow(static_cast<double>(hyper.beta1), step);
  const double correction2 = 1.0 - std::pow(static_cast<double>(hyper.beta2), step);
  const float step_size = static_cast<float>(hyper.learning_rate / correction1);
  const float inv_sqrt_correction2 = static_cast<float>(1.0 / std::sqrt(correction2));
  const float decay = 1.0f - hyper.learning_rate * hyper.weight_decay;
  const int64_t chunks = (n + kElementwiseChunk - 1) / kElementwiseChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (int64_t c = 0; c < chunks; c++) {
    const int64_t begin = c * kElementwiseChunk;
    adamw_range(params + begin, m + begin, v + begin, grads + begin,
                std::min(kElementwiseChunk, n - begin), hyper, step_size, inv_sqrt_correction2,
                decay);
  }
}

double square_sum(const float* values, int64_t n) {
  ProfileScope profile(KernelKind::KernelKind_optimizer);
  const int64_t chunks = (n + kElementwiseChunk - 1) / kElementwiseChunk;
  double sum = 0.0;
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements) reduction(+ : sum)
  for (int64_t c = 0; c < chunks; c++) {
    const int64_t begin = c * kElementwiseChunk;
    sum += sum_squares_range(values + begin, std::min(kElementwiseChunk, n - begin));
  }
  return sum;
}

double grad_norm(const float* grads, int64_t n) { return std::sqrt(square_sum(grads, n)); }

float grad_clip_scale(double norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0f;
  const double coefficient = max_norm / (norm + 1e-6);
  return coefficient < 1.0 ? static_cast<float>(coefficient) : 1.0f;
}

float lr_schedule(int64_t step, double max_lr, double min_lr, int64_t warmup_steps,
                  int64_t total_steps) {
  if (step < warmup_steps) {
    return static_cast<float>(max_lr * static_cast<double>(step + 1) / warmup_steps);
  }
  if (total_steps <= warmup_steps) return static_cast<float>(max_lr);
  double progress =
      static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
  if (progress > 1.0) progress = 1.0;
  const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return static_cast<float>(min_lr + cosine * (max_lr - min_lr));
}

}  // namespace alloy
