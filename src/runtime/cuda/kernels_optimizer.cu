// AdamW and the sum of squares behind gradient-norm clipping on the GPU, as
// runtime/cpu/optimizer.cpp: grid-stride loops over fp32 state, float4 packs when every array is
// aligned for them and a scalar tail otherwise.
#include <cmath>

#include "runtime/cuda/kernels.hpp"
#include "runtime/cuda/kernels_common.cuh"

namespace alloy {

namespace {

using namespace kernel_util;

// The per-step constants, computed on the host as the CPU optimizer does.
struct AdamWConstants {
  float beta1;
  float beta2;
  float eps;
  float grad_scale;
  float step_size;             // lr / (1 - beta1^step)
  float inv_sqrt_correction2;  // 1 / sqrt(1 - beta2^step)
  float decay;                 // 1 - lr weight_decay
};

// Pack p covers elements [p W, p W + W).
template <int W>
__global__ void adamw_kernel(float* params, bf16* params_bf16, const float* grads, float* m, float* v, int64_t packs,
                             AdamWConstants k) {
  for (int64_t p = thread_index(); p < packs; p += thread_count()) {
    const int64_t i = p * W;
    float pw[W];
    float gw[W];
    float mw[W];
    float vw[W];
    load_floats<W>(pw, params + i);
    load_floats<W>(gw, grads + i);
    load_floats<W>(mw, m + i);
    load_floats<W>(vw, v + i);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const float g = gw[j] * k.grad_scale;
      mw[j] = k.beta1 * mw[j] + (1.0f - k.beta1) * g;
      vw[j] = k.beta2 * vw[j] + (1.0f - k.beta2) * g * g;
      const float denom = sqrtf(vw[j]) * k.inv_sqrt_correction2 + k.eps;
      pw[j] = pw[j] * k.decay - k.step_size * mw[j] / denom;
    }
    store_floats<W>(params + i, pw);
    store_floats<W>(m + i, mw);
    store_floats<W>(v + i, vw);
    store_bf16<W>(params_bf16 + i, pw);
  }
}

template <int W>
__global__ void sum_squares_kernel(float* sum, const float* x, int64_t packs) {
  __shared__ float shared[kElementwiseThreads / kWarpSize];
  float partial = 0.0f;
  for (int64_t p = thread_index(); p < packs; p += thread_count()) {
    float xw[W];
    load_floats<W>(xw, x + p * W);
#pragma unroll
    for (int j = 0; j < W; ++j) partial += xw[j] * xw[j];
  }
  partial = block_sum(partial, shared);
  if (threadIdx.x == 0) atomicAdd(sum, partial);
}

}  // namespace

void cuda_adamw_update(float* params, bf16* params_bf16, const float* grads, float* m, float* v, int64_t n, float lr,
                       float beta1, float beta2, float eps, float weight_decay, float grad_scale, int64_t step,
                       cudaStream_t stream) {
  if (n <= 0) return;
  const double correction1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(step));
  const double correction2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(step));
  const AdamWConstants k{beta1,
                         beta2,
                         eps,
                         grad_scale,
                         static_cast<float>(lr / correction1),
                         static_cast<float>(1.0 / std::sqrt(correction2)),
                         1.0f - lr * weight_decay};
  const bool packed = is_aligned(params, 16) && is_aligned(grads, 16) && is_aligned(m, 16) && is_aligned(v, 16) &&
                      is_aligned(params_bf16, 8);
  const int64_t head = packed ? n / 4 * 4 : 0;
  if (head > 0) {
    adamw_kernel<4><<<grid_stride_blocks(head / 4), kElementwiseThreads, 0, stream>>>(params, params_bf16, grads, m, v,
                                                                                      head / 4, k);
    cuda_check_launch("adamw kernel");
  }
  if (n > head) {
    adamw_kernel<1><<<grid_stride_blocks(n - head), kElementwiseThreads, 0, stream>>>(
        params + head, params_bf16 + head, grads + head, m + head, v + head, n - head, k);
    cuda_check_launch("adamw kernel");
  }
}

void cuda_sum_squares(float* sum, const float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  const int64_t head = is_aligned(x, 16) ? n / 8 * 8 : 0;
  if (head > 0) {
    sum_squares_kernel<8><<<grid_stride_blocks(head / 8), kElementwiseThreads, 0, stream>>>(sum, x, head / 8);
    cuda_check_launch("sum_squares kernel");
  }
  if (n > head) {
    sum_squares_kernel<1><<<grid_stride_blocks(n - head), kElementwiseThreads, 0, stream>>>(sum, x + head, n - head);
    cuda_check_launch("sum_squares kernel");
  }
}

}  // namespace alloy
