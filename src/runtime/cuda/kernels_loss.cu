// Fused softmax cross-entropy on the GPU, as runtime/cpu/loss.cpp's forward and in-place
// backward in one kernel: one block per row, a first pass for the row's max and sum of
// exponentials (online softmax), a second that overwrites the logits with their gradient; and
// the sum of the per-token losses.
#include <cfloat>

#include "runtime/cuda/kernels.hpp"
#include "runtime/cuda/kernels_common.cuh"

namespace alloy {

namespace {

using namespace kernel_util;

constexpr int kLossThreads = 1024;

// Running max and sum of exp(x - max) over part of a row. The max starts at -FLT_MAX rather than
// -inf so that merging two empty states computes 0 * exp(0), not 0 * exp(nan).
struct SoftmaxState {
  float max;
  float sum;
};

__device__ __forceinline__ SoftmaxState softmax_merge(SoftmaxState a, SoftmaxState b) {
  const float m = fmaxf(a.max, b.max);
  return {m, a.sum * __expf(a.max - m) + b.sum * __expf(b.max - m)};
}

__device__ __forceinline__ SoftmaxState warp_softmax_merge(SoftmaxState state) {
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
    const SoftmaxState other{__shfl_xor_sync(0xffffffffu, state.max, offset),
                             __shfl_xor_sync(0xffffffffu, state.sum, offset)};
    state = softmax_merge(state, other);
  }
  return state;
}

// Row blockIdx.x of logits: (N, ld). W = 8: 16-byte packs (ld % 8 == 0 and the logits aligned, so
// a pack never crosses ld; the one crossing V is masked); W = 1: single elements.
template <int W>
__global__ void __launch_bounds__(kLossThreads) crossentropy_kernel(bf16* logits, float* losses, const int32_t* targets,
                                                                    int V, int ld, float dloss, bool backward) {
  __shared__ float shared_max[kLossThreads / kWarpSize];
  __shared__ float shared_sum[kLossThreads / kWarpSize];
  bf16* row = logits + static_cast<int64_t>(blockIdx.x) * ld;
  const int target = targets[blockIdx.x];
  // Read before the barrier below, after which the second pass may overwrite it.
  const float target_logit = threadIdx.x == 0 ? __bfloat162float(row[target]) : 0.0f;

  SoftmaxState state{-FLT_MAX, 0.0f};
  for (int c = threadIdx.x * W; c < V; c += kLossThreads * W) {
    float x[W];
    load_bf16<W>(x, row + c);
    float pack_max = state.max;
#pragma unroll
    for (int j = 0; j < W; ++j) {
      if (c + j < V) pack_max = fmaxf(pack_max, x[j]);
    }
    state.sum *= __expf(state.max - pack_max);
    state.max = pack_max;
#pragma unroll
    for (int j = 0; j < W; ++j) {
      if (c + j < V) state.sum += __expf(x[j] - pack_max);
    }
  }
  state = warp_softmax_merge(state);
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  if (lane == 0) {
    shared_max[warp] = state.max;
    shared_sum[warp] = state.sum;
  }
  __syncthreads();
  state =
      lane < kLossThreads / kWarpSize ? SoftmaxState{shared_max[lane], shared_sum[lane]} : SoftmaxState{-FLT_MAX, 0.0f};
  state = warp_softmax_merge(state);
  const float lse = state.max + logf(state.sum);
  if (threadIdx.x == 0) losses[blockIdx.x] = lse - target_logit;
  if (!backward) return;

  for (int c = threadIdx.x * W; c < ld; c += kLossThreads * W) {
    float x[W];
    load_bf16<W>(x, row + c);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const int v = c + j;
      x[j] = v < V ? __expf(x[j] - lse) * dloss - (v == target ? dloss : 0.0f) : 0.0f;
    }
    store_bf16<W>(row + c, x);
  }
}

// Each block adds its threads' partial sums (fp32 over a few elements each) to *sum in fp64.
__global__ void sum_kernel(double* sum, const float* x, int64_t n) {
  __shared__ float shared[kElementwiseThreads / kWarpSize];
  float partial = 0.0f;
  for (int64_t i = thread_index(); i < n; i += thread_count()) partial += x[i];
  partial = block_sum(partial, shared);
  if (threadIdx.x == 0) atomicAdd(sum, static_cast<double>(partial));
}

}  // namespace

void cuda_crossentropy(bf16* logits, float* losses, const int32_t* targets, int N, int V, int ld, float dloss,
                       bool backward, cudaStream_t stream) {
  if (N <= 0 || V <= 0) return;
  if (ld % 8 == 0 && is_aligned(logits, 16)) {
    crossentropy_kernel<8><<<N, kLossThreads, 0, stream>>>(logits, losses, targets, V, ld, dloss, backward);
  } else {
    crossentropy_kernel<1><<<N, kLossThreads, 0, stream>>>(logits, losses, targets, V, ld, dloss, backward);
  }
  cuda_check_launch("crossentropy kernel");
}

void cuda_sum(double* sum, const float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  sum_kernel<<<grid_stride_blocks(n), kElementwiseThreads, 0, stream>>>(sum, x, n);
  cuda_check_launch("sum kernel");
}

}  // namespace alloy
