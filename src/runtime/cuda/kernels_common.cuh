// Device helpers shared by the kernel files of the CUDA backend: warp and block reductions, packed
// loads and stores (eight bf16 or four floats in one 16-byte access) and launch sizes.
#pragma once

#include <cstdint>

#include "runtime/cuda/cuda_check.hpp"

namespace alloy::kernel_util {

inline constexpr int kWarpSize = 32;
// Threads per block of the grid-stride elementwise kernels; kResidentBlocks of them fill an SM.
inline constexpr int kElementwiseThreads = 256;
inline constexpr int kResidentBlocks = 2048 / kElementwiseThreads;

// ---- host side -----------------------------------------------------------------------------

inline bool is_aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Multiprocessors of the current device.
inline int cuda_sm_count() {
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  int sms = 0;
  cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "reading the GPU's SM count");
  return sms;
}

// Blocks of kElementwiseThreads for a grid-stride loop over `items`: one per item up to what the
// GPU holds at once (items > 0).
inline int grid_stride_blocks(int64_t items) {
  const int64_t wanted = (items + kElementwiseThreads - 1) / kElementwiseThreads;
  const int64_t resident = int64_t{cuda_sm_count()} * kResidentBlocks;
  return static_cast<int>(wanted < resident ? wanted : resident);
}

// Launch shape for kernels over (rows, packs_per_row): threadIdx.x / blockIdx.x cover the packs of
// a row, threadIdx.y / blockIdx.y the rows, which each thread loops over from row_first() with
// stride row_stride(), so any row count fits.
struct RowLaunch {
  dim3 grid;
  dim3 block;
};

inline RowLaunch row_launch(int64_t rows, int64_t packs_per_row) {
  // As few blocks per row as 256 threads allow, their threads split evenly (in whole warps);
  // short rows share a block so that it still has about 256 threads.
  const int64_t blocks_x = (packs_per_row + 255) / 256;
  const int64_t per_block = (packs_per_row + blocks_x - 1) / blocks_x;
  const int64_t threads_x = (per_block + kWarpSize - 1) / kWarpSize * kWarpSize;
  const int64_t rows_per_block = 256 / threads_x;
  const int64_t wanted_y = (rows + rows_per_block - 1) / rows_per_block;
  const int64_t blocks_y = wanted_y < 65535 ? wanted_y : 65535;
  return {dim3(static_cast<unsigned>(blocks_x), static_cast<unsigned>(blocks_y)),
          dim3(static_cast<unsigned>(threads_x), static_cast<unsigned>(rows_per_block))};
}

// ---- device side ---------------------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// Sum over the whole block (blockDim.x a multiple of 32); every thread gets it. shared: 32
// floats. Every thread of the block must call it.
__device__ __forceinline__ float block_sum(float x, float* shared) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  x = warp_sum(x);
  __syncthreads();  // an earlier call may still be reading shared
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  x = lane < static_cast<int>(blockDim.x / kWarpSize) ? shared[lane] : 0.0f;
  return warp_sum(x);
}

__device__ __forceinline__ float bf16_low(uint32_t word) { return __uint_as_float(word << 16); }
__device__ __forceinline__ float bf16_high(uint32_t word) { return __uint_as_float(word & 0xffff0000u); }
__device__ __forceinline__ uint32_t bf16_pair(float low, float high) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16(low))) |
         (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16(high))) << 16);
}

// x[0, W) = p[0, W) as floats. W = 8: one 16-byte load (p 16-byte aligned); W = 4: one 8-byte
// load (p 8-byte aligned); W = 1: one element.
template <int W>
__device__ __forceinline__ void load_bf16(float (&x)[W], const bf16* p) {
  static_assert(W == 1 || W == 4 || W == 8, "packs of 1, 4 or 8 bf16");
  if constexpr (W == 8) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      x[2 * k] = bf16_low(words[k]);
      x[2 * k + 1] = bf16_high(words[k]);
    }
  } else if constexpr (W == 4) {
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
    x[0] = bf16_low(raw.x);
    x[1] = bf16_high(raw.x);
    x[2] = bf16_low(raw.y);
    x[3] = bf16_high(raw.y);
  } else {
    x[0] = __bfloat162float(p[0]);
  }
}

// p[0, W) = x[0, W) rounded to bf16 (round to nearest even); alignment as for load_bf16.
template <int W>
__device__ __forceinline__ void store_bf16(bf16* p, const float (&x)[W]) {
  static_assert(W == 1 || W == 4 || W == 8, "packs of 1, 4 or 8 bf16");
  if constexpr (W == 8) {
    *reinterpret_cast<uint4*>(p) =
        make_uint4(bf16_pair(x[0], x[1]), bf16_pair(x[2], x[3]), bf16_pair(x[4], x[5]), bf16_pair(x[6], x[7]));
  } else if constexpr (W == 4) {
    *reinterpret_cast<uint2*>(p) = make_uint2(bf16_pair(x[0], x[1]), bf16_pair(x[2], x[3]));
  } else {
    p[0] = __float2bfloat16(x[0]);
  }
}

// x[0, W) = p[0, W): float4 loads when W is a multiple of 4 (p 16-byte aligned), else scalars.
template <int W>
__device__ __forceinline__ void load_floats(float (&x)[W], const float* p) {
  if constexpr (W % 4 == 0) {
#pragma unroll
    for (int k = 0; k < W / 4; ++k) {
      const float4 q = reinterpret_cast<const float4*>(p)[k];
      x[4 * k] = q.x;
      x[4 * k + 1] = q.y;
      x[4 * k + 2] = q.z;
      x[4 * k + 3] = q.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < W; ++j) x[j] = p[j];
  }
}

template <int W>
__device__ __forceinline__ void store_floats(float* p, const float (&x)[W]) {
  if constexpr (W % 4 == 0) {
#pragma unroll
    for (int k = 0; k < W / 4; ++k) {
      reinterpret_cast<float4*>(p)[k] = make_float4(x[4 * k], x[4 * k + 1], x[4 * k + 2], x[4 * k + 3]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < W; ++j) p[j] = x[j];
  }
}

// The first row of this thread and the stride of its row loop, for launches by row_launch.
__device__ __forceinline__ int64_t row_first() { return static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; }
__device__ __forceinline__ int64_t row_stride() { return static_cast<int64_t>(gridDim.y) * blockDim.y; }

// Index of this thread in a 1-D grid, and the grid-stride step.
__device__ __forceinline__ int64_t thread_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t thread_count() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

}  // namespace alloy::kernel_util
