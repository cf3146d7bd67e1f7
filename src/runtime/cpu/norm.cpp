// LayerNorm and RMSNorm: rows in parallel; weight gradients reduced serially (C-wide, cheap).
#include "runtime/cpu/norm.hpp"
#include "runtime/cpu/parallel.hpp"
#include "runtime/profile.hpp"

#include <cmath>
#include <cstdint>

namespace alloy {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int N, int C, float eps) {
  ProfileScope profile(KernelKind::KernelKind_norm);
#pragma omp parallel for schedule(static) if (int64_t{N} * C >= kParallelMinElements)
  for (int n = 0; n < N; n++) {
    const float* x = inp + static_cast<int64_t>(n) * C;
    float* y = out + static_cast<int64_t>(n) * C;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int c = 0; c < C; c++) sum += x[c];
    const float m = sum / static_cast<float>(C);
    float var = 0.0f;
#pragma omp simd reduction(+ : var)
    for (int c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
    const float s = 1.0f / std::sqrt(var / static_cast<float>(C) + eps);
    if (b != nullptr) {
      for (int c = 0; c < C; c++) y[c] = (x[c] - m) * s * w[c] + b[c];
    } else {
      for (int c = 0; c < C; c++) y[c] = (x[c] - m) * s * w[c];
    }
    mean[n] = m;
    rstd[n] = s;
  }
}

void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int N, int C) {
  ProfileScope profile(KernelKind::KernelKind_norm);
#pragma omp parallel for schedule(static) if (int64_t{N} * C >= kParallelMinElements)
  for (int n = 0; n < N; n++) {
    const float* x = inp + static_cast<int64_t>(n) * C;
    const float* g = dout + static_cast<int64_t>(n) * C;
    float* dx = dinp + static_cast<int64_t>(n) * C;
    const float m = mean[n];
    const float s = rstd[n];
    float dnorm_mean = 0.0f;
    float dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
    for (int c = 0; c < C; c++) {
      const float dnorm = g[c] * w[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * (x[c] - m) * s;
    }
    dnorm_mean /= static_cast<float>(C);
    dnorm_norm_mean /= static_cast<float>(C);
    for (int c = 0; c < C; c++) {
      const float norm = (x[c] - m) * s;
      dx[c] += (g[c] * w[c] - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
  for (int n = 0; n < N; n++) {
    const float* x = inp + static_cast<int64_t>(n) * C;
    const float* g = dout + static_cast<int64_t>(n) * C;
    const float m = mean[n];
    const float s = rstd[n];
    for (int c = 0; c < C; c++) dw[c] += g[c] * (x[c] - m) * s;
    if (db != nullptr) {
      for (int c = 0; c < C; c++) db[c] += g[c];
    }
  }
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                     float eps) {
  ProfileScope profile(KernelKind::KernelKind_norm);
#pragma omp parallel for schedule(static) if (int64_t{N} * C >= kParallelMinElements)
  for (int n = 0; n < N; n++) {
    const float* x = inp + static_cast<int64_t>(n) * C;
    float* y = out + static_cast<int64_t>(n) * C;
    float sum_squares = 0.0f;
#pragma omp simd reduction(+ : sum_squares)
    for (int c = 0; c < C; c++) sum_squares += x[c] * x[c];
    const float s = 1.0f / std::sqrt(sum_squares / static_cast<float>(C) + eps);
    for (int c = 0; c < C; c++) y[c] = x[c] * s * w[c];
    rstd[n] = s;
  }
}

void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                      const float* rstd, int N, int C) {
  ProfileScope profile(KernelKind::KernelKind_norm);
#pragma omp parallel for schedule(static) if (int64_t{N} * C >= kParallelMinElements)
  for (int n = 0; n < N; n++) {
    const float* x = inp + static_cast<int64_t>(n) * C;
    const float* g = dout + static_cast<int64_t>(n) * C;
    float* dx = dinp + static_cast<int64_t>(n) * C;
    const float s = rstd[n];
    float dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_norm_mean)
    for (int c = 0; c < C; c++) dnorm_norm_mean += g[c] * w[c] * x[c] * s;
    dnorm_norm_mean /= static_cast<float>(C);
    for (int c = 0; c < C; c++) dx[c] += (g[c] * w[c] - x[c] * s * dnorm_norm_mean) * s;
  }
  for (int n = 0; n < N; n++) {
    const float* x = inp + static_cast<int64_t>(n) * C;
    const float* g = dout + static_cast<int64_t>(n) * C;
    const float s = rstd[n];
    for (int c = 0; c < C; c++) dw[c] += g[c] * x[c] * s;
  }
}

}  // namespace alloy
