// AdamW (decoupled weight decay, bias correction), global gradient-norm clipping and the
// warm-up plus cosine learning-rate schedule (fp32, CPU).
#pragma once

#include <cstdint>

namespace alloy {

struct AdamWHyper {
  float learning_rate = 3e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // applied by the caller only to 2-D weights
  float grad_scale = 1.0f;    // multiplies every gradient first: the global-norm clip factor over the loss scale
};

// params, m, v, grads: (n); step counts from 1. Same update as torch.optim.AdamW on
// g = grad_scale * grads (grads itself is left as it is):
//   p -= lr wd p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= lr / (1 - b1^step) * m / (sqrt(v) / sqrt(1 - b2^step) + eps)
void adamw_update(float* params, float* m, float* v, const float* grads, int64_t n,
                  const AdamWHyper& hyper, int64_t step);

// values: (n) -> the sum of their squares, accumulated in double (vector loops over chunks).
double square_sum(const float* values, int64_t n);

// grads: (n) -> L2 norm, accumulated in double: sqrt(square_sum).
double grad_norm(const float* grads, int64_t n);

// The factor torch.nn.utils.clip_grad_norm_ scales gradients by: min(1, max_norm / (norm + 1e-6));
// 1 when max_norm <= 0 (clipping disabled). Applied through AdamWHyper::grad_scale, which saves
// a pass over the gradients.
float grad_clip_scale(double norm, double max_norm);

// Learning rate of the 0-based optimizer step: linear warm-up over warmup_steps to max_lr
// (step s gets max_lr (s + 1) / warmup_steps), then cosine from max_lr down to min_lr at
// total_steps, and min_lr after that.
float lr_schedule(int64_t step, double max_lr, double min_lr, int64_t warmup_steps,
                  int64_t total_steps);

}  // namespace alloy
