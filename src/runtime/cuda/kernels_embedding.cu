// Token and position embeddings on the GPU (as runtime/cpu/embedding.cpp) and the bias gradient
// (the column sums runtime/cpu/matmul.cpp adds to db): the kernels that gather rows of a table or
// sum rows into an fp32 weight gradient.
#include "runtime/cuda/kernels.hpp"
#include "runtime/cuda/kernels_common.cuh"

namespace alloy {

namespace {

using namespace kernel_util;

// Launched by row_launch over (B T, C / W): x indexes packs of W within a row, y the rows bt.
template <int W>
__global__ void embedding_forward_kernel(bf16* out, const int32_t* tokens, const bf16* wte, const bf16* wpe,
                                         int64_t rows, int T, int C) {
  const int c = (blockIdx.x * blockDim.x + threadIdx.x) * W;
  if (c >= C) return;
  for (int64_t bt = row_first(); bt < rows; bt += row_stride()) {
    float x[W];
    load_bf16<W>(x, wte + static_cast<int64_t>(tokens[bt]) * C + c);
    if (wpe != nullptr) {
      float position[W];
      load_bf16<W>(position, wpe + (bt % T) * C + c);
#pragma unroll
      for (int j = 0; j < W; ++j) x[j] += position[j];
    }
    store_bf16<W>(out + bt * C + c, x);
  }
}

// Launched by row_launch over (T, C): x is the column c, y the position t. The thread walks the batch at (t, c): one
// atomicAdd per element into dwte (tokens repeat), and the position's sum added to dwpe once
// (no other thread touches dwpe[t, c]). Neighbouring threads add to neighbouring floats, so the
// atomics of a warp coalesce.
__global__ void embedding_backward_kernel(float* dwte, float* dwpe, const bf16* dout, const int32_t* tokens, int B,
                                          int T, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int64_t t = row_first(); t < T; t += row_stride()) {
    float position_sum = 0.0f;
    for (int b = 0; b < B; ++b) {
      const int64_t bt = static_cast<int64_t>(b) * T + t;
      const float g = __bfloat162float(dout[bt * C + c]);
      atomicAdd(dwte + static_cast<int64_t>(tokens[bt]) * C + c, g);
      position_sum += g;
    }
    if (dwpe != nullptr) dwpe[t * C + c] += position_sum;
  }
}

constexpr int kBiasLanes = 32;  // blockDim.x: packs of W columns side by side
constexpr int kBiasRows = 8;    // blockDim.y: rows summed side by side
constexpr int kBiasMaxColumns = kBiasLanes * 8;

// Block (x, y) sums columns [x 32 W, x 32 W + 32 W) over the rows y 8 + ty, stepping by
// gridDim.y 8; the 8 row groups meet in shared memory and each column gets one atomicAdd per block.
template <int W>
__global__ void __launch_bounds__(kBiasLanes* kBiasRows)
    bias_backward_kernel(float* db, const bf16* dout, int N, int M) {
  __shared__ float partial[kBiasRows][kBiasMaxColumns];
  const int column0 = blockIdx.x * kBiasLanes * W;
  const int c = column0 + threadIdx.x * W;
  float sum[W] = {};
  if (c < M) {
    for (int64_t n = static_cast<int64_t>(blockIdx.y) * kBiasRows + threadIdx.y; n < N;
         n += static_cast<int64_t>(gridDim.y) * kBiasRows) {
      float x[W];
      load_bf16<W>(x, dout + n * M + c);
#pragma unroll
      for (int j = 0; j < W; ++j) sum[j] += x[j];
    }
  }
#pragma unroll
  for (int j = 0; j < W; ++j) partial[threadIdx.y][threadIdx.x * W + j] = sum[j];
  __syncthreads();
  const int k = threadIdx.y * kBiasLanes + threadIdx.x;  // 0 .. 255: one column of the block each
  if (k < kBiasLanes * W && column0 + k < M) {
    float total = 0.0f;
#pragma unroll
    for (int r = 0; r < kBiasRows; ++r) total += partial[r][k];
    atomicAdd(db + column0 + k, total);
  }
}

template <int W>
void bias_backward_launch(float* db, const bf16* dout, int N, int M, cudaStream_t stream) {
  const int column_blocks = cuda_blocks(M, kBiasLanes * W);
  const int64_t wanted_row_blocks = cuda_blocks(N, kBiasRows);
  // About kResidentBlocks blocks per SM in all, but at least one per column tile.
  int64_t row_blocks = int64_t{cuda_sm_count()} * kResidentBlocks / column_blocks;
  if (row_blocks < 1) row_blocks = 1;
  if (row_blocks > wanted_row_blocks) row_blocks = wanted_row_blocks;
  if (row_blocks > 65535) row_blocks = 65535;
  const dim3 grid(static_cast<unsigned>(column_blocks), static_cast<unsigned>(row_blocks));
  bias_backward_kernel<W><<<grid, dim3(kBiasLanes, kBiasRows), 0, stream>>>(db, dout, N, M);
  cuda_check_launch("bias_backward kernel");
}

}  // namespace

void cuda_embedding_forward(bf16* out, const int32_t* tokens, const bf16* wte, const bf16* wpe, int B, int T, int C,
                            cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(B) * T;
  if (rows <= 0 || C <= 0) return;
  if (C % 8 == 0 && is_aligned(out, 16) && is_aligned(wte, 16) && (wpe == nullptr || is_aligned(wpe, 16))) {
    const RowLaunch shape = row_launch(rows, C / 8);
    embedding_forward_kernel<8><<<shape.grid, shape.block, 0, stream>>>(out, tokens, wte, wpe, rows, T, C);
  } else {
    const RowLaunch shape = row_launch(rows, C);
    embedding_forward_kernel<1><<<shape.grid, shape.block, 0, stream>>>(out, tokens, wte, wpe, rows, T, C);
  }
  cuda_check_launch("embedding_forward kernel");
}

void cuda_embedding_backward(float* dwte, float* dwpe, const bf16* dout, const int32_t* tokens, int B, int T, int C,
                             cudaStream_t stream) {
  if (B <= 0 || T <= 0 || C <= 0) return;
  const RowLaunch shape = row_launch(T, C);
  embedding_backward_kernel<<<shape.grid, shape.block, 0, stream>>>(dwte, dwpe, dout, tokens, B, T, C);
  cuda_check_launch("embedding_backward kernel");
}

void cuda_bias_backward(float* db, const bf16* dout, int N, int M, cudaStream_t stream) {
  if (N <= 0 || M <= 0) return;
  if (M % 8 == 0 && is_aligned(dout, 16)) {
    bias_backward_launch<8>(db, dout, N, M, stream);
  } else {
    bias_backward_launch<1>(db, dout, N, M, stream);
  }
}

}  // namespace alloy
