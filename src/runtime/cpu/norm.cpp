// LayerNorm and RMSNorm: rows in parallel, each row an `omp simd` loop (AVX2+FMA clone where the
// CPU has it); weight gradients reduced serially over rows (C-wide, cheap).
#include "runtime/cpu/norm.hpp"

#include <cmath>
#include <cstdint>

#include "runtime/cpu/fastmath.hpp"
#include "runtime/cpu/parallel.hpp"
#include "runtime/profile.hpp"

namespace alloy {

namespace {

// x: (C) -> y: (C); returns (mean, rstd) through the pointers.
ALLOY_VECTOR_CLONES
void layernorm_row(float* y, float* mean, float* rstd, const float* x, const float* w,
                   const float* b, int C, float eps) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int c = 0; c < C; c++) sum += x[c];
  const float m = sum / static_cast<float>(C);
  float var = 0.0f;
#pragma omp simd reduction(+ : var)
  for (int c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
  const float s = 1.0f / std::sqrt(var / static_cast<float>(C) + eps);
  if (b != nullptr) {
#pragma omp simd
    for (int c = 0; c < C; c++) y[c] = (x[c] - m) * s * w[c] + b[c];
  } else {
#pragma omp simd
    for (int c = 0; c < C; c++) y[c] = (x[c] - m) * s * w[c];
  }
  *mean = m;
  *rstd = s;
}

ALLOY_VECTOR_CLONES
void layernorm_backward_row(float* dx, const float* g, const float* x, const float* w, float m,
                            float s, int C) {
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
#pragma omp simd
  for (int c = 0; c < C; c++) {
    const float norm = (x[c] - m) * s;
    dx[c] += (g[c] * w[c] - dnorm_mean - norm * dnorm_norm_mean) * s;
  }
}

// dw += g * (x - m) * s over one row (m = 0 for RMSNorm); db += g when db is given.
ALLOY_VECTOR_CLONES
void norm_weight_grad_row(float* dw, float* db, const float* g, const float* x, float m, float s,
                          int C) {
#pragma omp simd
  for (int c = 0; c < C; c++) dw[c] += g[c] * (x[c] - m) * s;
  if (db != nullptr) {
#pragma omp simd
    for (int c = 0; c < C; c++) db[c] += g[c];
  }
}

ALLOY_VECTOR_CLONES
float rmsnorm_row(float* y, const float* x, const float* w, int C, float eps) {
  float sum_squares = 0.0f;
#pragma omp simd reduction(+ : sum_squares)
  for (int c = 0; c < C; c++) sum_squares += x[c] * x[c];
  const float s = 1.0f / std::sqrt(sum_squares / static_cast<float>(C) + eps);
#pragma omp simd
  for (int c = 0; c < C; c++) y[c] = x[c] * s * w[c];
  return s;
}

ALLOY_VECTOR_CLONES
void rmsnorm_backward_row(float* dx, const float* g, const float* x, const float* w, float s,
                          int C) {
  float dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_norm_mean)
  for (int c = 0; c < C; c++) dnorm_norm_mean += g[c] * w[c] * x[c] * s;
  dnorm_norm_mean /= static_cast<float>(C);
#pragma omp simd
  for (int c = 0; c < C; c++) dx[c] += (g[c] * w[c] - x[c] * s * dnorm_norm_mean) * s;
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int N, int C, float eps) {
  ProfileScope profile(KernelKind::KernelKind_norm);
#pragma omp parallel for schedule(static) if (int64_t{N} * C >= kParallelMinElements)
  for (int n = 0; n < N; n++) {
    const int64_t row = static_cast<int64_t>(n) * C;
    layernorm_row(out + row, mean + n, rstd + n, inp + row, w, b, C, eps);
  }
}

void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int N, int C) {
  ProfileScope profile(KernelKind::KernelKind_norm);
#pragma omp parallel for schedule(static) if (int64_t{N} * C >= kParallelMinElements)
  for (int n = 0; n < N; n++) {
    const int64_t row = static_cast<int64_t>(n) * C;
    layernorm_backward_row(dinp + row, dout + row, inp + row, w, mean[n], rstd[n], C);
  }
  for (int n = 0; n < N; n++) {
    const int64_t row = static_cast<int64_t>(n) * C;
    norm_weight_grad_row(dw, db, dout + row, inp + row, mean[n], rstd[n], C);
  }
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                     float eps) {
  ProfileScope profile(KernelKind::KernelKind_norm);
#pragma omp parallel for schedule(static) if (int64_t{N} * C >= kParallelMinElements)
  for (int n = 0; n < N; n++) {
    const int64_t row = static_cast<int64_t>(n) * C;
    rstd[n] = rmsnorm_row(out + row, inp + row, w, C, eps);
  }
}

void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                      const float* rstd, int N, int C) {
  ProfileScope profile(KernelKind::KernelKind_norm);
#pragma omp parallel for schedule(static) if (int64_t{N} * C >= kParallelMinElements)
  for (int n = 0; n < N; n++) {
    const int64_t row = static_cast<int64_t>(n) * C;
    rmsnorm_backward_row(dinp + row, dout + row, inp + row, w, rstd[n], C);
  }
  for (int n = 0; n < N; n++) {
    const int64_t row = static_cast<int64_t>(n) * C;
    norm_weight_grad_row(dw, nullptr, dout + row, inp + row, 0.0f, rstd[n], C);
  }
}

}  // namespace alloy
