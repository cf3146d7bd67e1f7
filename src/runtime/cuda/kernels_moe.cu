// Mixture-of-Experts kernels on the GPU, formula for formula as runtime/cpu/moe.cpp: the router's
// softmax, top-k and renormalisation (one thread per token: E and K are small), their backward,
// the row gather of the permutation, its scatter-add back (token-major through the inverse
// permutation, so no two threads write one row), the weighted combine and its backward (a warp
// per token and pick for the dot product), and the router probabilities' column sums.
#include "runtime/cuda/kernels.hpp"
#include "runtime/cuda/kernels_common.cuh"

namespace alloy {

namespace {

using namespace kernel_util;


__global__ void moe_route_forward_kernel(float* probs, int32_t* expert, float* weight, const bf16* logits, int N, int E,
                                         int K, bool normalize) {
  for (int64_t n = thread_index(); n < N; n += thread_count()) {
    const bf16* row = logits + n * E;
    float* p = probs + n * E;
    float best = __bfloat162float(row[0]);
    for (int e = 1; e < E; ++e) best = fmaxf(best, __bfloat162float(row[e]));
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += exp(static_cast<double>(__bfloat162float(row[e]) - best));
    for (int e = 0; e < E; ++e) p[e] = static_cast<float>(exp(static_cast<double>(__bfloat162float(row[e]) - best)) / sum);
    int32_t* picks = expert + n * K;
    float* w = weight + n * K;
    double picked_sum = 0;
    for (int k = 0; k < K; ++k) {  // the most probable not yet picked; ties: the lower index
      int choice = -1;
      for (int e = 0; e < E; ++e) {
        bool taken = false;
        for (int j = 0; j < k; ++j) taken = taken || picks[j] == e;
        if (!taken && (choice < 0 || p[e] > p[choice])) choice = e;
      }
      picks[k] = choice;
      w[k] = p[choice];
      picked_sum += p[choice];
    }
    if (normalize)
      for (int k = 0; k < K; ++k) w[k] = static_cast<float>(w[k] / picked_sum);
  }
}

__global__ void moe_route_backward_kernel(bf16* dlogits, const float* dweight, const float* aux_dprobs,
                                          const float* probs, const int32_t* expert, const float* weight, int N, int E,
                                          int K, bool normalize) {
  for (int64_t n = thread_index(); n < N; n += thread_count()) {
    const float* p = probs + n * E;
    const int32_t* picks = expert + n * K;
    const float* dw = dweight + n * K;
    const float* w = weight + n * K;
    float dp[kCudaMoeMaxExperts];  // d(loss)/d(probs) of this token
    for (int e = 0; e < E; ++e) dp[e] = aux_dprobs != nullptr ? aux_dprobs[e] : 0.0f;
    if (normalize) {
      double picked_sum = 0, dot = 0;
      for (int k = 0; k < K; ++k) {
        picked_sum += p[picks[k]];
        dot += static_cast<double>(dw[k]) * w[k];
      }
      for (int k = 0; k < K; ++k) dp[picks[k]] += static_cast<float>((dw[k] - dot) / picked_sum);
    } else {
      for (int k = 0; k < K; ++k) dp[picks[k]] += dw[k];
    }
    double inner = 0;
    for (int e = 0; e < E; ++e) inner += static_cast<double>(p[e]) * dp[e];
    for (int e = 0; e < E; ++e) dlogits[n * E + e] = __float2bfloat16(static_cast<float>(p[e] * (dp[e] - inner)));
  }
}

// Element c of permuted row r: the row of its token.
__global__ void moe_gather_kernel(bf16* xp, const bf16* x, const int32_t* slots, int64_t NK, int K, int C) {
  const int64_t total = NK * C;
  for (int64_t i = thread_index(); i < total; i += thread_count()) {
    const int64_t r = i / C;
    xp[i] = x[int64_t{slots[r] / K} * C + i % C];
  }
}

// Element c of token n: its K permuted rows added in pick order, in fp32, rounded once.
__global__ void moe_scatter_add_kernel(bf16* dx, const bf16* dxp, const int32_t* rows, int64_t N, int K, int C) {
  const int64_t total = N * C;
  for (int64_t i = thread_index(); i < total; i += thread_count()) {
    const int64_t n = i / C;
    const int64_t c = i % C;
    float sum = __bfloat162float(dx[i]);
    for (int k = 0; k < K; ++k) sum += __bfloat162float(dxp[int64_t{rows[n * K + k]} * C + c]);
    dx[i] = __float2bfloat16(sum);
  }
}

__global__ void moe_combine_forward_kernel(bf16* out, const bf16* yp, const float* weight, const int32_t* rows,
                                           int64_t N, int K, int C) {
  const int64_t total = N * C;
  for (int64_t i = thread_index(); i < total; i += thread_count()) {
    const int64_t n = i / C;
    const int64_t c = i % C;
    float sum = __bfloat162float(out[i]);
    for (int k = 0; k < K; ++k) sum += weight[n * K + k] * __bfloat162float(yp[int64_t{rows[n * K + k]} * C + c]);
    out[i] = __float2bfloat16(sum);
  }
}

// One warp per slot n K + k: dyp's row = weight * dout's, dweight = <dout, y>.
__global__ void moe_combine_backward_kernel(bf16* dyp, float* dweight, const bf16* dout, const bf16* yp,
                                            const float* weight, const int32_t* rows, int64_t NK, int K, int C) {
  const int64_t warps = thread_count() / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  for (int64_t slot = thread_index() / kWarpSize; slot < NK; slot += warps) {
    const bf16* d = dout + (slot / K) * C;
    const int64_t row = rows[slot];
    const bf16* y = yp + row * C;
    bf16* dy = dyp + row * C;
    const float w = weight[slot];
    float dot = 0;
    for (int c = lane; c < C; c += kWarpSize) {
      const float g = __bfloat162float(d[c]);
      dot += g * __bfloat162float(y[c]);
      dy[c] = __float2bfloat16(w * g);
    }
    dot = warp_sum(dot);
    if (lane == 0) dweight[slot] = dot;
  }
}

// sums[e] += probs[n, e] over n: one thread per expert column, in double.
__global__ void moe_prob_sums_kernel(double* sums, const float* probs, int N, int E) {
  for (int64_t e = thread_index(); e < E; e += thread_count()) {
    double sum = 0;
    for (int n = 0; n < N; ++n) sum += probs[int64_t{n} * E + e];
    sums[e] += sum;
  }
}

int blocks_for(int64_t items) { return items > 0 ? grid_stride_blocks(items) : 1; }

}  // namespace

void cuda_moe_route_forward(float* probs, int32_t* expert, float* weight, const bf16* logits, int N, int E, int K,
                            bool normalize, cudaStream_t stream) {
  if (N == 0) return;
  moe_route_forward_kernel<<<blocks_for(N), kElementwiseThreads, 0, stream>>>(probs, expert, weight, logits, N, E, K,
                                                                              normalize);
  cuda_check(cudaGetLastError(), "moe_route_forward_kernel");
}

void cuda_moe_route_backward(bf16* dlogits, const float* dweight, const float* aux_dprobs, const float* probs,
                             const int32_t* expert, const float* weight, int N, int E, int K, bool normalize,
                             cudaStream_t stream) {
  if (N == 0) return;
  moe_route_backward_kernel<<<blocks_for(N), kElementwiseThreads, 0, stream>>>(dlogits, dweight, aux_dprobs, probs,
                                                                               expert, weight, N, E, K, normalize);
  cuda_check(cudaGetLastError(), "moe_route_backward_kernel");
}

void cuda_moe_gather(bf16* xp, const bf16* x, const int32_t* slots, int64_t NK, int K, int C, cudaStream_t stream) {
  if (NK == 0) return;
  moe_gather_kernel<<<blocks_for(NK * C), kElementwiseThreads, 0, stream>>>(xp, x, slots, NK, K, C);
  cuda_check(cudaGetLastError(), "moe_gather_kernel");
}

void cuda_moe_scatter_add(bf16* dx, const bf16* dxp, const int32_t* rows, int64_t N, int K, int C,
                          cudaStream_t stream) {
  if (N == 0) return;
  moe_scatter_add_kernel<<<blocks_for(N * C), kElementwiseThreads, 0, stream>>>(dx, dxp, rows, N, K, C);
  cuda_check(cudaGetLastError(), "moe_scatter_add_kernel");
}

void cuda_moe_combine_forward(bf16* out, const bf16* yp, const float* weight, const int32_t* rows, int64_t N, int K,
                              int C, cudaStream_t stream) {
  if (N == 0) return;
  moe_combine_forward_kernel<<<blocks_for(N * C), kElementwiseThreads, 0, stream>>>(out, yp, weight, rows, N, K, C);
  cuda_check(cudaGetLastError(), "moe_combine_forward_kernel");
}

void cuda_moe_combine_backward(bf16* dyp, float* dweight, const bf16* dout, const bf16* yp, const float* weight,
                               const int32_t* rows, int64_t N, int K, int C, cudaStream_t stream) {
  if (N == 0) return;
  const int64_t NK = N * K;
  moe_combine_backward_kernel<<<blocks_for(NK * kWarpSize), kElementwiseThreads, 0, stream>>>(dyp, dweight, dout, yp,
                                                                                              weight, rows, NK, K, C);
  cuda_check(cudaGetLastError(), "moe_combine_backward_kernel");
}

void cuda_moe_prob_sums(double* sums, const float* probs, int N, int E, cudaStream_t stream) {
  moe_prob_sums_kernel<<<blocks_for(E), kElementwiseThreads, 0, stream>>>(sums, probs, N, E);
  cuda_check(cudaGetLastError(), "moe_prob_sums_kernel");
}

}  // namespace alloy
