// GELU, SwiGLU and residual kernels: parallel, vectorisable loops.
#include "runtime/cpu/activation.hpp"
#include "runtime/cpu/parallel.hpp"

#include <cmath>

namespace alloy {

namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

}  // namespace

void gelu_forward(float* out, const float* inp, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (int64_t i = 0; i < n; i++) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + std::tanh(kGeluScale * (x + kGeluCubic * x * x * x)));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (int64_t i = 0; i < n; i++) {
    const float x = inp[i];
    const float u = kGeluScale * (x + kGeluCubic * x * x * x);
    const float th = std::tanh(u);
    const float du_dx = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
    const float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du_dx;
    dinp[i] += grad * dout[i];
  }
}

void swiglu_forward(float* out, const float* inp, int64_t N, int F) {
#pragma omp parallel for schedule(static) if (N * F >= kParallelMinElements)
  for (int64_t n = 0; n < N; n++) {
    const float* gate = inp + n * 2 * F;
    const float* up = gate + F;
    float* y = out + n * F;
    for (int f = 0; f < F; f++) {
      const float g = gate[f];
      y[f] = g / (1.0f + std::exp(-g)) * up[f];
    }
  }
}

void swiglu_backward(float* dinp, const float* inp, const float* dout, int64_t N, int F) {
#pragma omp parallel for schedule(static) if (N * F >= kParallelMinElements)
  for (int64_t n = 0; n < N; n++) {
    const float* gate = inp + n * 2 * F;
    const float* up = gate + F;
    const float* g_out = dout + n * F;
    float* dgate = dinp + n * 2 * F;
    float* dup = dgate + F;
    for (int f = 0; f < F; f++) {
      const float g = gate[f];
      const float sig = 1.0f / (1.0f + std::exp(-g));
      dgate[f] += g_out[f] * up[f] * sig * (1.0f + g * (1.0f - sig));
      dup[f] += g_out[f] * g * sig;
    }
  }
}

void residual_forward(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void residual_backward(float* da, float* db, const float* dout, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (int64_t i = 0; i < n; i++) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

}  // namespace alloy
