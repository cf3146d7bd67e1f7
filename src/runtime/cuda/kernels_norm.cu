// LayerNorm and RMSNorm on the GPU, forward and backward, formula for formula as the CPU kernels
// in runtime/cpu/norm.cpp. One kernel template serves both norms: RMSNorm is LayerNorm with the
// mean fixed at 0 and no bias. Rows are handled one warp each (16-byte packs when C % 8 == 0 and
// the rows are aligned); the weight gradients are summed per block, then added to dw / db with
// one atomicAdd per column per block.
#include "runtime/cuda/kernels.hpp"
#include "runtime/cuda/kernels_common.cuh"

namespace alloy {

namespace {

using namespace kernel_util;

constexpr int kNormThreads = 256;
constexpr int kNormWarps = kNormThreads / kWarpSize;  // rows in flight per block
// Rows per tile of the backward: its warps first write dinp for the tile's rows, then its threads
// sum the tile's columns into the block's dw / db partial sums.
constexpr int kNormTileRows = 32;

// x: (C) -> y: (C); lane `lane` of the warp handles the packs lane * W, lane * W + 32 W, ...
// kLayer: LayerNorm, mean subtracted (b may be nullptr); else RMSNorm (mean 0, b unused).
template <bool kLayer, int W>
__global__ void __launch_bounds__(kNormThreads)
    norm_forward_kernel(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* w, const bf16* b, int N,
                        int C, float eps) {
  const int lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * kNormWarps + threadIdx.x / kWarpSize;
  if (row >= N) return;  // whole warps leave together, so the shuffles below see full warps
  const bf16* x = inp + static_cast<int64_t>(row) * C;
  bf16* y = out + static_cast<int64_t>(row) * C;

  float m = 0.0f;
  if constexpr (kLayer) {
    float sum = 0.0f;
    for (int c = lane * W; c < C; c += kWarpSize * W) {
      float xv[W];
      load_bf16<W>(xv, x + c);
#pragma unroll
      for (int j = 0; j < W; ++j) sum += xv[j];
    }
    m = warp_sum(sum) / static_cast<float>(C);
  }
  float var = 0.0f;
  for (int c = lane * W; c < C; c += kWarpSize * W) {
    float xv[W];
    load_bf16<W>(xv, x + c);
#pragma unroll
    for (int j = 0; j < W; ++j) var += (xv[j] - m) * (xv[j] - m);
  }
  const float s = 1.0f / sqrtf(warp_sum(var) / static_cast<float>(C) + eps);

  for (int c = lane * W; c < C; c += kWarpSize * W) {
    float xv[W];
    float wv[W];
    load_bf16<W>(xv, x + c);
    load_bf16<W>(wv, w + c);
    float yv[W];
#pragma unroll
    for (int j = 0; j < W; ++j) yv[j] = (xv[j] - m) * s * wv[j];
    if constexpr (kLayer) {
      if (b != nullptr) {
        float bv[W];
        load_bf16<W>(bv, b + c);
#pragma unroll
        for (int j = 0; j < W; ++j) yv[j] += bv[j];
      }
    }
    store_bf16<W>(y + c, yv);
  }
  if (lane == 0) {
    if constexpr (kLayer) mean[row] = m;
    rstd[row] = s;
  }
}

// One row of the input gradient, by one warp: dx: (C) += (g w - mean(g w) - norm mean(g w norm)) s
// with norm = (x - m) s (the mean(g w) term is absent for RMSNorm).
template <bool kLayer, int W>
__device__ __forceinline__ void norm_backward_row(bf16* dx, const bf16* g, const bf16* x, const bf16* w, float m,
                                                  float s, int C, int lane) {
  float dnorm_sum = 0.0f;
  float dnorm_norm_sum = 0.0f;
  for (int c = lane * W; c < C; c += kWarpSize * W) {
    float gv[W];
    float xv[W];
    float wv[W];
    load_bf16<W>(gv, g + c);
    load_bf16<W>(xv, x + c);
    load_bf16<W>(wv, w + c);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const float dnorm = gv[j] * wv[j];
      dnorm_sum += dnorm;
      dnorm_norm_sum += dnorm * (xv[j] - m) * s;
    }
  }
  const float dnorm_mean = kLayer ? warp_sum(dnorm_sum) / static_cast<float>(C) : 0.0f;
  const float dnorm_norm_mean = warp_sum(dnorm_norm_sum) / static_cast<float>(C);
  for (int c = lane * W; c < C; c += kWarpSize * W) {
    float gv[W];
    float xv[W];
    float wv[W];
    float dxv[W];
    load_bf16<W>(gv, g + c);
    load_bf16<W>(xv, x + c);
    load_bf16<W>(wv, w + c);
    load_bf16<W>(dxv, dx + c);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const float norm = (xv[j] - m) * s;
      dxv[j] += (gv[j] * wv[j] - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
    store_bf16<W>(dx + c, dxv);
  }
}

// A persistent grid: block k takes the tiles k, k + gridDim.x, ... Dynamic shared memory holds
// the block's partial sums dw: (C), then db: (C) when kLayer and db is given; column c belongs to
// thread c % kNormThreads from zeroing to the final atomicAdd, so no barrier is needed.
template <bool kLayer, int W>
__global__ void __launch_bounds__(kNormThreads)
    norm_backward_kernel(bf16* dinp, float* dw, float* db, const bf16* dout, const bf16* inp, const bf16* w,
                         const float* mean, const float* rstd, int N, int C) {
  extern __shared__ float weight_grad_partial[];
  const bool with_db = kLayer && db != nullptr;
  float* dw_partial = weight_grad_partial;
  float* db_partial = weight_grad_partial + C;
  for (int c = threadIdx.x; c < C; c += kNormThreads) {
    dw_partial[c] = 0.0f;
    if (with_db) db_partial[c] = 0.0f;
  }
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int tiles = (N + kNormTileRows - 1) / kNormTileRows;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int row0 = tile * kNormTileRows;
    const int rows = min(kNormTileRows, N - row0);
    for (int r = warp; r < rows; r += kNormWarps) {
      const int row = row0 + r;
      const int64_t offset = static_cast<int64_t>(row) * C;
      norm_backward_row<kLayer, W>(dinp + offset, dout + offset, inp + offset, w, kLayer ? mean[row] : 0.0f, rstd[row],
                                   C, lane);
    }
    // dw += g (x - m) s, db += g over the tile's rows; reads hit the cache the rows just went through.
    for (int c = threadIdx.x; c < C; c += kNormThreads) {
      float dw_sum = 0.0f;
      float db_sum = 0.0f;
      for (int r = 0; r < rows; ++r) {
        const int row = row0 + r;
        const int64_t i = static_cast<int64_t>(row) * C + c;
        const float g = __bfloat162float(dout[i]);
        const float m = kLayer ? mean[row] : 0.0f;
        dw_sum += g * (__bfloat162float(inp[i]) - m) * rstd[row];
        db_sum += g;
      }
      dw_partial[c] += dw_sum;
      if (with_db) db_partial[c] += db_sum;
    }
  }
  for (int c = threadIdx.x; c < C; c += kNormThreads) {
    atomicAdd(dw + c, dw_partial[c]);
    if (with_db) atomicAdd(db + c, db_partial[c]);
  }
}

template <bool kLayer>
void norm_forward_launch(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* w, const bf16* b, int N,
                         int C, float eps, cudaStream_t stream, const char* name) {
  if (N <= 0 || C <= 0) return;
  const bool packed = C % 8 == 0 && is_aligned(out, 16) && is_aligned(inp, 16) && is_aligned(w, 16) &&
                      (b == nullptr || is_aligned(b, 16));
  const int blocks = cuda_blocks(N, kNormWarps);
  if (packed) {
    norm_forward_kernel<kLayer, 8><<<blocks, kNormThreads, 0, stream>>>(out, mean, rstd, inp, w, b, N, C, eps);
  } else {
    norm_forward_kernel<kLayer, 1><<<blocks, kNormThreads, 0, stream>>>(out, mean, rstd, inp, w, b, N, C, eps);
  }
  cuda_check_launch(name);
}

template <bool kLayer, int W>
void norm_backward_launch_packs(bf16* dinp, float* dw, float* db, const bf16* dout, const bf16* inp, const bf16* w,
                                const float* mean, const float* rstd, int N, int C, cudaStream_t stream,
                                const char* name) {
  const auto kernel = norm_backward_kernel<kLayer, W>;
  const int partials = kLayer && db != nullptr ? 2 : 1;
  const size_t shared_bytes = static_cast<size_t>(partials) * C * sizeof(float);
  if (shared_bytes > 48 * 1024) {
    cuda_check(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared_bytes)),
        "allowing the norm backward its shared memory (C too large?)");
  }
  int blocks_per_sm = 0;
  cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, kNormThreads, shared_bytes),
             "sizing the norm backward grid");
  const int tiles = cuda_blocks(N, kNormTileRows);
  const int resident = cuda_sm_count() * (blocks_per_sm > 0 ? blocks_per_sm : 1);
  const int blocks = tiles < resident ? tiles : resident;
  norm_backward_kernel<kLayer, W>
      <<<blocks, kNormThreads, shared_bytes, stream>>>(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  cuda_check_launch(name);
}

template <bool kLayer>
void norm_backward_launch(bf16* dinp, float* dw, float* db, const bf16* dout, const bf16* inp, const bf16* w,
                          const float* mean, const float* rstd, int N, int C, cudaStream_t stream, const char* name) {
  if (N <= 0 || C <= 0) return;
  const bool packed =
      C % 8 == 0 && is_aligned(dinp, 16) && is_aligned(dout, 16) && is_aligned(inp, 16) && is_aligned(w, 16);
  if (packed) {
    norm_backward_launch_packs<kLayer, 8>(dinp, dw, db, dout, inp, w, mean, rstd, N, C, stream, name);
  } else {
    norm_backward_launch_packs<kLayer, 1>(dinp, dw, db, dout, inp, w, mean, rstd, N, C, stream, name);
  }
}

}  // namespace

void cuda_layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* w, const bf16* b, int N,
                            int C, float eps, cudaStream_t stream) {
  norm_forward_launch<true>(out, mean, rstd, inp, w, b, N, C, eps, stream, "layernorm_forward kernel");
}

void cuda_layernorm_backward(bf16* dinp, float* dw, float* db, const bf16* dout, const bf16* inp, const bf16* w,
                             const float* mean, const float* rstd, int N, int C, cudaStream_t stream) {
  norm_backward_launch<true>(dinp, dw, db, dout, inp, w, mean, rstd, N, C, stream, "layernorm_backward kernel");
}

void cuda_rmsnorm_forward(bf16* out, float* rstd, const bf16* inp, const bf16* w, int N, int C, float eps,
                          cudaStream_t stream) {
  norm_forward_launch<false>(out, nullptr, rstd, inp, w, nullptr, N, C, eps, stream, "rmsnorm_forward kernel");
}

void cuda_rmsnorm_backward(bf16* dinp, float* dw, const bf16* dout, const bf16* inp, const bf16* w, const float* rstd,
                           int N, int C, cudaStream_t stream) {
  norm_backward_launch<false>(dinp, dw, nullptr, dout, inp, w, nullptr, rstd, N, C, stream, "rmsnorm_backward kernel");
}

}  // namespace alloy
