// AdamW update, clipping and the learning-rate schedule.
#include "runtime/cpu/optimizer.hpp"
#include "runtime/cpu/parallel.hpp"
#include "runtime/profile.hpp"

#include <cmath>
#include <numbers>

namespace alloy {

void adamw_update(float* params, float* m, float* v, const float* grads, int64_t n,
                  const AdamWHyper& hyper, int64_t step) {
  ProfileScope profile(KernelKind::KernelKind_optimizer);
  const double correction1 = 1.0 - std::pow(static_cast<double>(hyper.beta1), step);
  const double correction2 = 1.0 - std::pow(static_cast<double>(hyper.beta2), step);
  const float step_size = static_cast<float>(hyper.learning_rate / correction1);
  const float inv_sqrt_correction2 = static_cast<float>(1.0 / std::sqrt(correction2));
  const float decay = 1.0f - hyper.learning_rate * hyper.weight_decay;
  const float b1 = hyper.beta1;
  const float b2 = hyper.beta2;
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMinElements)
  for (int64_t i = 0; i < n; i++) {
    const float g = grads[i];
    m[i] = b1 * m[i] + (1.0f - b1) * g;
    v[i] = b2 * v[i] + (1.0f - b2) * g * g;
    const float denom = std::sqrt(v[i]) * inv_sqrt_correction2 + hyper.eps;
    params[i] = params[i] * decay - step_size * m[i] / denom;
  }
}

double grad_norm(const float* grads, int64_t n) {
  ProfileScope profile(KernelKind::KernelKind_optimizer);
  double sum = 0.0;
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements) reduction(+ : sum)
  for (int64_t i = 0; i < n; i++) sum += static_cast<double>(grads[i]) * grads[i];
  return std::sqrt(sum);
}

void grad_clip(float* grads, int64_t n, double norm, double max_norm) {
  ProfileScope profile(KernelKind::KernelKind_optimizer);
  if (max_norm <= 0.0) return;
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient >= 1.0) return;
  const float scale = static_cast<float>(coefficient);
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMinElements)
  for (int64_t i = 0; i < n; i++) grads[i] *= scale;
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
