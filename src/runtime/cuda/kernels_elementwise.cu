// Elementwise kernels on the GPU: GELU (tanh approximation), SwiGLU, the residual add, RoPE and
// the fp32 <-> bf16 conversions, formula for formula as runtime/cpu/activation.cpp and
// attention.cpp. Flat kernels split n into a head of 8-element packs (16-byte loads, when every
// pointer is 16-byte aligned) and a scalar tail, each a grid-stride loop.
#include <type_traits>

#include "runtime/cuda/kernels.hpp"
#include "runtime/cuda/kernels_common.cuh"

namespace alloy {

namespace {

using namespace kernel_util;

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

// tanh as the CPU's tanh_fast: 1 - 2 / (exp(2 u) + 1); exp overflowing to inf gives 1.
__device__ __forceinline__ float tanh_via_exp(float u) { return 1.0f - __fdividef(2.0f, __expf(2.0f * u) + 1.0f); }

__device__ __forceinline__ float gelu_value(float x) {
  return 0.5f * x * (1.0f + tanh_via_exp(kGeluScale * (x + kGeluCubic * x * x * x)));
}

__device__ __forceinline__ float gelu_grad(float x) {
  const float th = tanh_via_exp(kGeluScale * (x + kGeluCubic * x * x * x));
  const float du_dx = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du_dx;
}

// Pack p covers elements [p W, p W + W) of every array.
template <int W>
__global__ void gelu_forward_kernel(bf16* out, const bf16* inp, int64_t packs) {
  for (int64_t p = thread_index(); p < packs; p += thread_count()) {
    float x[W];
    load_bf16<W>(x, inp + p * W);
#pragma unroll
    for (int j = 0; j < W; ++j) x[j] = gelu_value(x[j]);
    store_bf16<W>(out + p * W, x);
  }
}

// dinp may equal dout: each pack is read whole before it is written.
template <int W>
__global__ void gelu_backward_kernel(bf16* dinp, const bf16* inp, const bf16* dout, int64_t packs) {
  for (int64_t p = thread_index(); p < packs; p += thread_count()) {
    float x[W];
    float g[W];
    load_bf16<W>(x, inp + p * W);
    load_bf16<W>(g, dout + p * W);
#pragma unroll
    for (int j = 0; j < W; ++j) g[j] = gelu_grad(x[j]) * g[j];
    store_bf16<W>(dinp + p * W, g);
  }
}

// out may alias a or b.
template <int W>
__global__ void residual_forward_kernel(bf16* out, const bf16* a, const bf16* b, int64_t packs) {
  for (int64_t p = thread_index(); p < packs; p += thread_count()) {
    float av[W];
    float bv[W];
    load_bf16<W>(av, a + p * W);
    load_bf16<W>(bv, b + p * W);
#pragma unroll
    for (int j = 0; j < W; ++j) av[j] += bv[j];
    store_bf16<W>(out + p * W, av);
  }
}

template <int W>
__global__ void float_to_bf16_kernel(bf16* out, const float* in, int64_t packs) {
  for (int64_t p = thread_index(); p < packs; p += thread_count()) {
    float x[W];
    load_floats<W>(x, in + p * W);
    store_bf16<W>(out + p * W, x);
  }
}

template <int W>
__global__ void bf16_to_float_kernel(float* out, const bf16* in, int64_t packs) {
  for (int64_t p = thread_index(); p < packs; p += thread_count()) {
    float x[W];
    load_bf16<W>(x, in + p * W);
    store_floats<W>(out + p * W, x);
  }
}

// Launched by row_launch over (N, F / W): x indexes packs of W within the row, y the rows.
// inp rows are [gate (F), up (F)].
template <int W>
__global__ void swiglu_forward_kernel(bf16* out, const bf16* inp, int64_t N, int F) {
  const int f = (blockIdx.x * blockDim.x + threadIdx.x) * W;
  if (f >= F) return;
  for (int64_t n = row_first(); n < N; n += row_stride()) {
    const bf16* gate = inp + n * 2 * F;
    float g[W];
    float u[W];
    load_bf16<W>(g, gate + f);
    load_bf16<W>(u, gate + F + f);
#pragma unroll
    for (int j = 0; j < W; ++j) g[j] = __fdividef(g[j], 1.0f + __expf(-g[j])) * u[j];
    store_bf16<W>(out + n * F + f, g);
  }
}

template <int W>
__global__ void swiglu_backward_kernel(bf16* dinp, const bf16* inp, const bf16* dout, int64_t N, int F) {
  const int f = (blockIdx.x * blockDim.x + threadIdx.x) * W;
  if (f >= F) return;
  for (int64_t n = row_first(); n < N; n += row_stride()) {
    const bf16* gate = inp + n * 2 * F;
    float g[W];
    float u[W];
    float d[W];
    load_bf16<W>(g, gate + f);
    load_bf16<W>(u, gate + F + f);
    load_bf16<W>(d, dout + n * F + f);
    float dgate[W];
    float dup[W];
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const float sig = __fdividef(1.0f, 1.0f + __expf(-g[j]));
      dgate[j] = d[j] * u[j] * sig * (1.0f + g[j] * (1.0f - sig));
      dup[j] = d[j] * g[j] * sig;
    }
    bf16* row = dinp + n * 2 * F;
    store_bf16<W>(row + f, dgate);
    store_bf16<W>(row + F + f, dup);
  }
}

// Launched by row_launch over (B T, D / 2): x is the pair index i, y the row bt; R = (Hq + 2 Hkv) D.
// The angle is computed in double, as the CPU's tables are, and turns the pair (i, i + D/2) of
// each of the `heads` = Hq + Hkv rotated heads of the row. sign +1: forward; -1: its transpose.
__global__ void rope_kernel(bf16* qkv, int64_t rows, int T, int heads, int D, int64_t R, float theta, float sign) {
  const int half = D / 2;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= half) return;
  const double inv_freq = pow(static_cast<double>(theta), -2.0 * i / D);
  for (int64_t bt = row_first(); bt < rows; bt += row_stride()) {
    double sin_angle = 0.0;
    double cos_angle = 0.0;
    sincos(static_cast<double>(bt % T) * inv_freq, &sin_angle, &cos_angle);
    const float c = static_cast<float>(cos_angle);
    const float s = static_cast<float>(sin_angle);
    bf16* row = qkv + bt * R;
    for (int h = 0; h < heads; ++h) {
      bf16* x = row + static_cast<int64_t>(h) * D;
      const float x1 = __bfloat162float(x[i]);
      const float x2 = __bfloat162float(x[i + half]);
      x[i] = __float2bfloat16(x1 * c - sign * x2 * s);
      x[i + half] = __float2bfloat16(x2 * c + sign * x1 * s);
    }
  }
}

// Launches kernel<8> on the whole packs of n (when `packed`) and kernel<1> on the rest; `launch`
// gets the element offset, the number of packs and the pack width.
template <typename Launch>
void launch_packed(int64_t n, bool packed, const char* name, Launch launch) {
  if (n <= 0) return;
  const int64_t head = packed ? n / 8 * 8 : 0;
  if (head > 0) {
    launch(int64_t{0}, head / 8, std::integral_constant<int, 8>{});
    cuda_check_launch(name);
  }
  if (n > head) {
    launch(head, n - head, std::integral_constant<int, 1>{});
    cuda_check_launch(name);
  }
}

// Rotates the q and k heads of qkv: (B, T, (Hq + 2 Hkv) D) by sign (+1 forward, -1 backward).
void rope_launch(bf16* qkv, int B, int T, int Hq, int Hkv, int D, float theta, float sign, cudaStream_t stream,
                 const char* name) {
  const int64_t rows = static_cast<int64_t>(B) * T;
  if (rows <= 0 || D < 2 || Hq + Hkv <= 0) return;
  const RowLaunch shape = row_launch(rows, D / 2);
  const int64_t R = static_cast<int64_t>(Hq + 2 * Hkv) * D;
  rope_kernel<<<shape.grid, shape.block, 0, stream>>>(qkv, rows, T, Hq + Hkv, D, R, theta, sign);
  cuda_check_launch(name);
}

}  // namespace

void cuda_gelu_forward(bf16* out, const bf16* inp, int64_t n, cudaStream_t stream) {
  const bool packed = is_aligned(out, 16) && is_aligned(inp, 16);
  launch_packed(n, packed, "gelu_forward kernel", [&](int64_t offset, int64_t packs, auto width) {
    constexpr int W = decltype(width)::value;
    gelu_forward_kernel<W>
        <<<grid_stride_blocks(packs), kElementwiseThreads, 0, stream>>>(out + offset, inp + offset, packs);
  });
}

void cuda_gelu_backward(bf16* dinp, const bf16* inp, const bf16* dout, int64_t n, cudaStream_t stream) {
  const bool packed = is_aligned(dinp, 16) && is_aligned(inp, 16) && is_aligned(dout, 16);
  launch_packed(n, packed, "gelu_backward kernel", [&](int64_t offset, int64_t packs, auto width) {
    constexpr int W = decltype(width)::value;
    gelu_backward_kernel<W><<<grid_stride_blocks(packs), kElementwiseThreads, 0, stream>>>(dinp + offset, inp + offset,
                                                                                           dout + offset, packs);
  });
}

void cuda_swiglu_forward(bf16* out, const bf16* inp, int64_t N, int F, cudaStream_t stream) {
  if (N <= 0 || F <= 0) return;
  if (F % 8 == 0 && is_aligned(out, 16) && is_aligned(inp, 16)) {
    const RowLaunch shape = row_launch(N, F / 8);
    swiglu_forward_kernel<8><<<shape.grid, shape.block, 0, stream>>>(out, inp, N, F);
  } else {
    const RowLaunch shape = row_launch(N, F);
    swiglu_forward_kernel<1><<<shape.grid, shape.block, 0, stream>>>(out, inp, N, F);
  }
  cuda_check_launch("swiglu_forward kernel");
}

void cuda_swiglu_backward(bf16* dinp, const bf16* inp, const bf16* dout, int64_t N, int F, cudaStream_t stream) {
  if (N <= 0 || F <= 0) return;
  if (F % 8 == 0 && is_aligned(dinp, 16) && is_aligned(inp, 16) && is_aligned(dout, 16)) {
    const RowLaunch shape = row_launch(N, F / 8);
    swiglu_backward_kernel<8><<<shape.grid, shape.block, 0, stream>>>(dinp, inp, dout, N, F);
  } else {
    const RowLaunch shape = row_launch(N, F);
    swiglu_backward_kernel<1><<<shape.grid, shape.block, 0, stream>>>(dinp, inp, dout, N, F);
  }
  cuda_check_launch("swiglu_backward kernel");
}

void cuda_residual_forward(bf16* out, const bf16* a, const bf16* b, int64_t n, cudaStream_t stream) {
  const bool packed = is_aligned(out, 16) && is_aligned(a, 16) && is_aligned(b, 16);
  launch_packed(n, packed, "residual_forward kernel", [&](int64_t offset, int64_t packs, auto width) {
    constexpr int W = decltype(width)::value;
    residual_forward_kernel<W>
        <<<grid_stride_blocks(packs), kElementwiseThreads, 0, stream>>>(out + offset, a + offset, b + offset, packs);
  });
}

void cuda_rope_forward(bf16* qkv, int B, int T, int Hq, int Hkv, int D, float theta, cudaStream_t stream) {
  rope_launch(qkv, B, T, Hq, Hkv, D, theta, 1.0f, stream, "rope_forward kernel");
}

void cuda_rope_backward(bf16* dqkv, int B, int T, int Hq, int Hkv, int D, float theta, cudaStream_t stream) {
  rope_launch(dqkv, B, T, Hq, Hkv, D, theta, -1.0f, stream, "rope_backward kernel");
}

void cuda_float_to_bf16(bf16* out, const float* in, int64_t n, cudaStream_t stream) {
  const bool packed = is_aligned(out, 16) && is_aligned(in, 16);
  launch_packed(n, packed, "float_to_bf16 kernel", [&](int64_t offset, int64_t packs, auto width) {
    constexpr int W = decltype(width)::value;
    float_to_bf16_kernel<W>
        <<<grid_stride_blocks(packs), kElementwiseThreads, 0, stream>>>(out + offset, in + offset, packs);
  });
}

void cuda_bf16_to_float(float* out, const bf16* in, int64_t n, cudaStream_t stream) {
  const bool packed = is_aligned(out, 16) && is_aligned(in, 16);
  launch_packed(n, packed, "bf16_to_float kernel", [&](int64_t offset, int64_t packs, auto width) {
    constexpr int W = decltype(width)::value;
    bf16_to_float_kernel<W>
        <<<grid_stride_blocks(packs), kElementwiseThreads, 0, stream>>>(out + offset, in + offset, packs);
  });
}

}  // namespace alloy
