// Causal attention forward on the GPU: the fused FlashAttention-2 style kernel on tensor cores
// (each warp owns 16 query rows of a 64-row block and runs an online softmax in registers over
// key tiles of 64), the plain fp32 reference kernel, the shape checks and the choice between the
// two paths (ALLOY_CUDA_ATTENTION).
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "runtime/cuda/attention.hpp"
#include "runtime/cuda/attention_mma.cuh"
#include "runtime/cuda/attention_reference.hpp"
#include "spec/error.hpp"

namespace alloy {
namespace {

using namespace attention_detail;

// grid (B Hq, ceil(T / 64)), 128 threads. Block y handles query tile (tiles - 1 - y), so the
// longest rows (most key tiles) start first. out: (B, T, Hq D), lse: (B, Hq, T). At D = 64 the
// register cap for 4 blocks per SM (128) spills a few words yet edges out 3 blocks on an H200.
template <int D>
__global__ void __launch_bounds__(kThreads, D == 64 ? 4 : 2)
    attention_forward_kernel(bf16* out, float* lse, const bf16* qkv, int T, int Hq, int Hkv, float scale) {
  constexpr int ld = padded_cols<D>();
  __shared__ __align__(16) bf16 k_tile[kTile * ld];  // (64 keys, D), first holding the Q tile
  __shared__ __align__(16) bf16 v_tile[kTile * ld];  // (64 keys, D)

  const int b = static_cast<int>(blockIdx.x) / Hq, h = static_cast<int>(blockIdx.x) % Hq;
  const int kv_head = h / (Hq / Hkv);
  const int q_tile = static_cast<int>(gridDim.y - 1 - blockIdx.y);
  const int q0 = q_tile * kTile;
  const int64_t R = static_cast<int64_t>(Hq + 2 * Hkv) * D;
  const bf16* q_src = qkv + static_cast<int64_t>(b) * T * R + static_cast<int64_t>(h) * D;
  const bf16* k_src = qkv + static_cast<int64_t>(b) * T * R + static_cast<int64_t>(Hq + kv_head) * D;
  const bf16* v_src = qkv + static_cast<int64_t>(b) * T * R + static_cast<int64_t>(Hq + Hkv + kv_head) * D;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;

  // This warp's 16 query rows as A fragments for every k-step of 16 along D, kept in registers.
  tile_load_async<D>(k_tile, q_src, R, q0, T);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  uint32_t q_frag[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) load_a(q_frag[kk], k_tile, ld, warp * 16, kk * 16);
  __syncthreads();

  // Two cp.async groups per key tile, K then V, always committed (empty past the last tile) so that
  // wait<1> means "all but the newest group have landed".
  tile_load_async<D>(k_tile, k_src, R, 0, T);
  cp_async_commit();
  tile_load_async<D>(v_tile, v_src, R, 0, T);
  cp_async_commit();

  // Row i = 0, 1 of this lane: query q0 + warp * 16 + g + 8 i (accumulator elements 2i, 2i+1).
  float o_acc[D / 8][4] = {};
  float row_max[2] = {-INFINITY, -INFINITY};  // of the scores in log2 units (score * scale * log2 e)
  float row_sum[2] = {0.0f, 0.0f};            // this lane's part of sum exp2(x - row_max)
  const float log2_scale = scale * kLog2e;

  for (int kt = 0; kt <= q_tile; ++kt) {
    cp_async_wait<1>();  // K tile kt
    __syncthreads();
    // S = Q K^T for 16 queries x 64 keys: n-tile n covers keys kt * 64 + 8 n + [0, 8).
    float s[8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t kb[4];
        load_b_rows_n(kb, k_tile, ld, np * 16, kk * 16);
        mma_bf16(s[2 * np], q_frag[kk], kb[0], kb[1]);
        mma_bf16(s[2 * np + 1], q_frag[kk], kb[2], kb[3]);
      }
    }
    __syncthreads();  // every warp is done with k_tile
    if (kt < q_tile) tile_load_async<D>(k_tile, k_src, R, (kt + 1) * kTile, T);
    cp_async_commit();

    // Only the diagonal tile has keys after some of its queries (and keys >= T, which come after
    // every valid query); earlier tiles are wholly visible.
    if (kt == q_tile) {
#pragma unroll
      for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = kt * kTile + n * 8 + 2 * t + (e & 1);
          const int query = q0 + warp * 16 + g + (e >> 1) * 8;
          if (key > query) s[n][e] = -INFINITY;
        }
      }
    }

    // Online softmax: new running max per row (the 4 lanes of a quad share the row), rescale the
    // old sum and output, exponentiate in place.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int n = 0; n < 8; ++n) tile_max = fmaxf(tile_max, fmaxf(s[n][2 * i], s[n][2 * i + 1]));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float new_max = fmaxf(row_max[i], tile_max * log2_scale);
      // A row with nothing visible yet keeps max -inf; subtracting 0 then keeps exp2 at 0, not NaN.
      const float base = new_max == -INFINITY ? 0.0f : new_max;
      const float correction = exp2f(row_max[i] - base);
      row_max[i] = new_max;
      row_sum[i] *= correction;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        o_acc[n][2 * i] *= correction;
        o_acc[n][2 * i + 1] *= correction;
      }
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        s[n][2 * i] = exp2f(s[n][2 * i] * log2_scale - base);
        s[n][2 * i + 1] = exp2f(s[n][2 * i + 1] * log2_scale - base);
        row_sum[i] += s[n][2 * i] + s[n][2 * i + 1];
      }
    }

    cp_async_wait<1>();  // V tile kt
    __syncthreads();
    // O += P V: P (16 x 64 keys) as A fragments straight from the score accumulators.
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint32_t p_frag[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                                  pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                  pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t vb[4];
        load_b_rows_k(vb, v_tile, ld, dp * 16, kk * 16);
        mma_bf16(o_acc[2 * dp], p_frag, vb[0], vb[1]);
        mma_bf16(o_acc[2 * dp + 1], p_frag, vb[2], vb[3]);
      }
    }
    __syncthreads();  // every warp is done with v_tile
    if (kt < q_tile) tile_load_async<D>(v_tile, v_src, R, (kt + 1) * kTile, T);
    cp_async_commit();
  }
  cp_async_wait<0>();

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float sum = row_sum[i];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int query = q0 + warp * 16 + g + 8 * i;
    if (query >= T) continue;
    const float inv_sum = 1.0f / sum;
    bf16* out_row = out + (static_cast<int64_t>(b) * T + query) * Hq * D + static_cast<int64_t>(h) * D;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      *reinterpret_cast<__nv_bfloat162*>(out_row + n * 8 + 2 * t) =
          __floats2bfloat162_rn(o_acc[n][2 * i] * inv_sum, o_acc[n][2 * i + 1] * inv_sum);
    }
    if (t == 0) lse[(static_cast<int64_t>(b) * Hq + h) * T + query] = (row_max[i] + log2f(sum)) * kLn2;
  }
}

// ---- reference path: one block of kRefThreads per (b, h, query) row, fp32 throughout ----

constexpr int kRefThreads = 128;

// Sum (or max) of v over the block; every thread gets the result. scratch: kRefThreads / 32 floats.
__device__ float block_reduce(float v, float* scratch, bool take_max) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, v, offset);
    v = take_max ? fmaxf(v, other) : v + other;
  }
  __syncthreads();  // scratch may still be read from a previous call
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  float result = scratch[0];
  for (int w = 1; w < kRefThreads / 32; ++w) result = take_max ? fmaxf(result, scratch[w]) : result + scratch[w];
  return result;
}

// grid (B Hq T), kRefThreads threads. Scores are recomputed in each of the three passes (max,
// sum, weighted values) so nothing of size T is stored.
__global__ void __launch_bounds__(kRefThreads)
    attention_reference_forward_kernel(bf16* out, float* lse, const bf16* qkv, int T, int Hq, int Hkv, int D,
                                       float scale) {
  __shared__ float q[128];
  __shared__ float p[kRefThreads];
  __shared__ float scratch[kRefThreads / 32];
  const int64_t row = blockIdx.x;
  const int query = static_cast<int>(row % T);
  const int bh = static_cast<int>(row / T);
  const int b = bh / Hq, h = bh % Hq, kv_head = h / (Hq / Hkv);
  const int64_t R = static_cast<int64_t>(Hq + 2 * Hkv) * D;
  const bf16* batch = qkv + static_cast<int64_t>(b) * T * R;
  const bf16* k_src = batch + static_cast<int64_t>(Hq + kv_head) * D;
  const bf16* v_src = batch + static_cast<int64_t>(Hq + Hkv + kv_head) * D;
  const int tid = static_cast<int>(threadIdx.x);
  for (int d = tid; d < D; d += kRefThreads) q[d] = __bfloat162float(batch[query * R + h * D + d]);
  __syncthreads();

  auto score = [&](int key) {
    float dot = 0.0f;
    for (int d = 0; d < D; ++d) dot += q[d] * __bfloat162float(k_src[key * R + d]);
    return dot * scale;
  };
  float max_score = -INFINITY;
  for (int key = tid; key <= query; key += kRefThreads) max_score = fmaxf(max_score, score(key));
  max_score = block_reduce(max_score, scratch, true);
  float sum = 0.0f;
  for (int key = tid; key <= query; key += kRefThreads) sum += expf(score(key) - max_score);
  sum = block_reduce(sum, scratch, false);

  float acc = 0.0f;  // output element d = tid (tid < D)
  for (int first = 0; first <= query; first += kRefThreads) {
    const int key = first + tid;
    p[tid] = key <= query ? expf(score(key) - max_score) / sum : 0.0f;
    __syncthreads();
    const int count = min(kRefThreads, query - first + 1);
    if (tid < D) {
      for (int j = 0; j < count; ++j) acc += p[j] * __bfloat162float(v_src[(first + j) * R + tid]);
    }
    __syncthreads();
  }
  if (tid < D) out[(static_cast<int64_t>(b) * T + query) * Hq * D + h * D + tid] = __float2bfloat16(acc);
  if (tid == 0) lse[(static_cast<int64_t>(b) * Hq + h) * T + query] = max_score + logf(sum);
}

}  // namespace

AttentionPath attention_path_from_environment() {
  const char* value = std::getenv("ALLOY_CUDA_ATTENTION");
  if (value == nullptr || std::string(value).empty() || std::string(value) == "fast") {
    return AttentionPath::AttentionPath_fast;
  }
  if (std::string(value) == "reference") return AttentionPath::AttentionPath_reference;
  throw Error("ALLOY_CUDA_ATTENTION is '" + std::string(value) + "', which names no attention path",
              {"", "ALLOY_CUDA_ATTENTION"}, "set it to 'fast' (the default) or 'reference', or unset it");
}

void cuda_attention_check_shape(int Hq, int Hkv, int D) {
  if (D != 64 && D != 128) {
    throw Error("fused GPU attention supports head_dim 64 or 128, not " + std::to_string(D), {"", "head_dim"},
                "choose a model whose hidden size / heads is 64 or 128, or train on the CPU");
  }
  if (Hq < 1 || Hkv < 1 || Hq % Hkv != 0) {
    throw Error("GPU attention needs query heads (" + std::to_string(Hq) +
                    ") to be a positive multiple of key/value heads (" + std::to_string(Hkv) + ")",
                {"", "heads"}, "set the number of key/value heads to a divisor of the number of query heads");
  }
}

void attention_check_sizes(int B, int T, int Hq, int Hkv, int D) {
  cuda_attention_check_shape(Hq, Hkv, D);
  if (B < 1 || T < 1) {
    throw Error("GPU attention got batch " + std::to_string(B) + " and sequence length " + std::to_string(T) +
                    "; both must be at least 1",
                {"", "batch"}, "pass a positive batch size and sequence length");
  }
  if (static_cast<int64_t>(B) * Hq > 0x7fffffff || static_cast<int64_t>(B) * Hq * T > 0x7fffffff) {
    throw Error("GPU attention of " + std::to_string(B) + " x " + std::to_string(Hq) + " heads x " + std::to_string(T) +
                    " tokens is beyond one launch",
                {"", "batch"}, "split the batch into smaller micro-batches");
  }
  if (cuda_blocks(T, kTile) > 65535) {
    throw Error("GPU attention supports sequences of up to " + std::to_string(65535 * kTile) + " tokens, not " +
                    std::to_string(T),
                {"", "seq_len"}, "use a shorter sequence length");
  }
}

void attention_check_aligned(const void* pointer, int alignment_bytes, const char* what) {
  if (reinterpret_cast<uintptr_t>(pointer) % static_cast<uintptr_t>(alignment_bytes) != 0) {
    throw Error(
        std::string("fused GPU attention needs ") + what + " aligned to " + std::to_string(alignment_bytes) + " bytes",
        {"", what}, "pass buffers from cudaMalloc or the arena (256-byte aligned) at their start");
  }
}

void cuda_attention_reference_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int Hq, int Hkv, int D,
                                      cudaStream_t stream) {
  attention_check_sizes(B, T, Hq, Hkv, D);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  attention_reference_forward_kernel<<<static_cast<unsigned>(static_cast<int64_t>(B) * Hq * T), kRefThreads, 0,
                                       stream>>>(out, lse, qkv, T, Hq, Hkv, D, scale);
  cuda_check_launch("attention_reference_forward_kernel");
}

void cuda_attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int Hq, int Hkv, int D,
                            cudaStream_t stream) {
  if (attention_path_from_environment() == AttentionPath::AttentionPath_reference) {
    cuda_attention_reference_forward(out, lse, qkv, B, T, Hq, Hkv, D, stream);
    return;
  }
  attention_check_sizes(B, T, Hq, Hkv, D);
  attention_check_aligned(qkv, 16, "qkv");
  attention_check_aligned(out, 4, "out");
  const dim3 grid(static_cast<unsigned>(B * Hq), static_cast<unsigned>(cuda_blocks(T, kTile)));
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  if (D == 64) {
    attention_forward_kernel<64><<<grid, kThreads, 0, stream>>>(out, lse, qkv, T, Hq, Hkv, scale);
  } else {
    attention_forward_kernel<128><<<grid, kThreads, 0, stream>>>(out, lse, qkv, T, Hq, Hkv, scale);
  }
  cuda_check_launch("attention_forward_kernel");
}

}  // namespace alloy
