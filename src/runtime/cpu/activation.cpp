// GELU, SwiGLU and residual kernels: parallel over chunks or rows, each chunk an `omp simd` loop
// with an AVX2+FMA clone.
#include "runtime/cpu/activation.hpp"

// Partial redundancy elimination turns exp_fast's clamps into branches that stop the `omp simd`
// loops from vectorising (GCC 12, -O2); this file's kernels are faster without it.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-tree-pre")
#endif

#include <algorithm>

#include "runtime/cpu/fastmath.hpp"
#include "runtime/cpu/parallel.hpp"
#include "runtime/profile.hpp"

namespace alloy {

namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

ALLOY_VECTOR_CLONES
void gelu_forward_range(float* out, const float* inp, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + tanh_fast(kGeluScale * (x + kGeluCubic * x * x * x)));
  }
}

ALLOY_VECTOR_CLONES
void gelu_backward_range(float* dinp, const float* inp, const float* dout, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    const float x = inp[i];
    const float th = tanh_fast(kGeluScale * (x + kGeluCubic * x * x * x));
    const float du_dx = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
    const float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du_dx;
    dinp[i] += grad * dout[i];
  }
}

ALLOY_VECTOR_CLONES
void swiglu_forward_row(float* y, const float* gate, const float* up, int F) {
#pragma omp simd
  for (int f = 0; f < F; f++) {
    const float g = gate[f];
    y[f] = g / (1.0f + exp_fast(-g)) * up[f];
  }
}

ALLOY_VECTOR_CLONES
void swiglu_backward_row(float* dgate, float* dup, const float* g_out, const float* gate,
                         const float* up, int F) {
#pragma omp simd
  for (int f = 0; f < F; f++) {
    const float g = gate[f];
    const float sig = 1.0f / (1.0f + exp_fast(-g));
    dgate[f] += g_out[f] * up[f] * sig * (1.0f + g * (1.0f - sig));
    dup[f] += g_out[f] * g * sig;
  }
}

}  // namespace

void gelu_forward(float* out, const float* inp, int64_t n) {
  ProfileScope profile(KernelKind::KernelKind_elementwise);
  const int64_t chunks = (n + kElementwiseChunk - 1) / kElementwiseChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (int64_t c = 0; c < chunks; c++) {
    const int64_t begin = c * kElementwiseChunk;
    gelu_forward_range(out + begin, inp + begin, std::min(kElementwiseChunk, n - begin));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  ProfileScope profile(KernelKind::KernelKind_elementwise);
  const int64_t chunks = (n + kElementwiseChunk - 1) / kElementwiseChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (int64_t c = 0; c < chunks; c++) {
    const int64_t begin = c * kElementwiseChunk;
    gelu_backward_range(dinp + begin, inp + begin, dout + begin,
                        std::min(kElementwiseChunk, n - begin));
  }
}

void swiglu_forward(float* out, const float* inp, int64_t N, int F) {
  ProfileScope profile(KernelKind::KernelKind_elementwise);
#pragma omp parallel for schedule(static) if (N * F >= kParallelMinElements)
  for (int64_t n = 0; n < N; n++) {
    const float* gate = inp + n * 2 * F;
    swiglu_forward_row(out + n * F, gate, gate + F, F);
  }
}

void swiglu_backward(float* dinp, const float* inp, const float* dout, int64_t N, int F) {
  ProfileScope profile(KernelKind::KernelKind_elementwise);
#pragma omp parallel for schedule(static) if (N * F >= kParallelMinElements)
  for (int64_t n = 0; n < N; n++) {
    const float* gate = inp + n * 2 * F;
    float* dgate = dinp + n * 2 * F;
    swiglu_backward_row(dgate, dgate + F, dout + n * F, gate, gate + F, F);
  }
}

void residual_forward(float* out, const float* a, const float* b, int64_t n) {
  ProfileScope profile(KernelKind::KernelKind_elementwise);
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMinElements)
  for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void residual_backward(float* da, float* db, const float* dout, int64_t n) {
  ProfileScope profile(KernelKind::KernelKind_elementwise);
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMinElements)
  for (int64_t i = 0; i < n; i++) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

}  // namespace alloy
