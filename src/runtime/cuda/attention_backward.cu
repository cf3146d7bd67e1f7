// Causal attention backward on the GPU: the fused FlashAttention-2 style kernels on tensor cores
// (delta = rowsum(dO * O); one block per (batch, key/value head, 64 keys) looping over the query
// heads of its group and the query tiles after it, dK and dV in registers, dQ through fp32
// atomics into a workspace; then dQ to bf16), and the plain fp32 reference kernels.
#include <cmath>

#include "runtime/cuda/attention.hpp"
#include "runtime/cuda/attention_mma.cuh"
#include "runtime/cuda/attention_reference.hpp"

namespace alloy {
namespace {

using namespace attention_detail;

int64_t round_up_256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

// One warp per (b, t, h): delta: (B, Hq, T) = sum over d of dout * out (both (B, T, Hq D)).
__global__ void attention_delta_kernel(float* delta, const bf16* dout, const bf16* out, int B, int T, int Hq, int D) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;  // (b, t, h)
  if (row >= static_cast<int64_t>(B) * T * Hq) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  float sum = 0.0f;
  for (int d = lane; d < D; d += 32) sum += __bfloat162float(dout[row * D + d]) * __bfloat162float(out[row * D + d]);
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  const int h = static_cast<int>(row % Hq);
  const int64_t bt = row / Hq;
  const int t = static_cast<int>(bt % T), b = static_cast<int>(bt / T);
  if (lane == 0) delta[(static_cast<int64_t>(b) * Hq + h) * T + t] = sum;
}

// dq_accum: (B, T, Hq D) fp32 -> the query columns of dqkv: (B, T, R), times the score scale.
__global__ void attention_dq_convert_kernel(bf16* dqkv, const float* dq_accum, int64_t rows, int Hq, int Hkv, int D,
                                            float scale) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t width = static_cast<int64_t>(Hq) * D;
  if (i >= rows * width) return;
  const int64_t row = i / width, col = i % width;
  dqkv[row * (width + 2LL * Hkv * D) + col] = __float2bfloat16(dq_accum[i] * scale);
}

// Buffers of query tiles: with two, the next tile loads while the current one is processed; at
// D = 128 two would need just over half of an SM's 228 KiB, halving the blocks per SM.
template <int D>
constexpr int backward_buffers() {
  return D == 64 ? 2 : 1;
}

// Dynamic shared memory of the main kernel: K and V tiles (64, D + 8); per buffer, Q and dO tiles
// (64, D + 8) and lse and delta of the 64 queries; the dS^T tile (64 keys, 64 + 8 queries).
template <int D>
constexpr int backward_smem_bytes() {
  return (2 + 2 * backward_buffers<D>()) * kTile * padded_cols<D>() * 2 + kTile * padded_cols<kTile>() * 2 +
         backward_buffers<D>() * 2 * kTile * 4;
}

// Adds the pair (x, y) to dst[0], dst[1] (8-byte aligned): one vector atomic where the GPU has it.
__device__ __forceinline__ void atomic_add_pair(float* dst, float x, float y) {
#if __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(dst), make_float2(x, y));
#else
  atomicAdd(dst, x);
  atomicAdd(dst + 1, y);
#endif
}

// grid (B Hkv, ceil(T / 64)), 128 threads, backward_smem_bytes<D>() of dynamic shared memory.
// Block (x, y) owns keys [64 y, 64 y + 64) of key/value head x % Hkv and loops over the query heads
// of that group and, for each, the query tiles from y on; warp w owns keys 64 y + 16 w + [0, 16)
// for dK, dV and queries 16 w + [0, 16) of the current query tile for dQ.
// At D = 64 the register cap for 3 blocks per SM (168) costs a few spilled words but beats 2 blocks
// of 255 registers (131 against 124 TFLOP/s on an H200 at GPT-2-small shapes).
template <int D>
__global__ void __launch_bounds__(kThreads, D == 64 ? 3 : 2)
    attention_backward_kernel(bf16* dqkv, float* dq_accum, const bf16* dout, const bf16* qkv, const float* lse,
                              const float* delta, int T, int Hq, int Hkv, float scale) {
  constexpr int ld = padded_cols<D>();
  constexpr int ld_s = padded_cols<kTile>();
  constexpr int buffers = backward_buffers<D>();
  static_assert(kThreads == 2 * kTile, "load_step gives lse to threads [0, 64) and delta to [64, 128)");
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* k_tile = reinterpret_cast<bf16*>(smem);                           // (64 keys, D)
  bf16* v_tile = k_tile + kTile * ld;                                     // (64 keys, D)
  bf16* q_buffers = v_tile + kTile * ld;                                  // buffers x (64 queries, D)
  bf16* do_buffers = q_buffers + buffers * kTile * ld;                    // buffers x (64 queries, D)
  bf16* ds_tile = do_buffers + buffers * kTile * ld;                      // (64 keys, 64 queries): dS^T
  float* lse_buffers = reinterpret_cast<float*>(ds_tile + kTile * ld_s);  // buffers x (64 queries)
  float* delta_buffers = lse_buffers + buffers * kTile;                   // buffers x (64 queries)

  const int b = static_cast<int>(blockIdx.x) / Hkv, kv_head = static_cast<int>(blockIdx.x) % Hkv;
  const int group = Hq / Hkv;
  const int key_tile = static_cast<int>(blockIdx.y);
  const int k0 = key_tile * kTile;
  const int q_tiles = static_cast<int>(gridDim.y) - key_tile;  // query tiles per query head
  const int steps = group * q_tiles;
  const int64_t R = static_cast<int64_t>(Hq + 2 * Hkv) * D;
  const int64_t out_stride = static_cast<int64_t>(Hq) * D;
  const bf16* batch = qkv + static_cast<int64_t>(b) * T * R;
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const float log2_scale = scale * kLog2e;

  // Step i covers query head kv_head * group + i / q_tiles, query tile key_tile + i % q_tiles.
  auto load_step = [&](int step) {
    const int h = kv_head * group + step / q_tiles;
    const int q0 = (key_tile + step % q_tiles) * kTile;
    const int buffer = step % buffers;
    tile_load_async<D>(q_buffers + buffer * kTile * ld, batch + static_cast<int64_t>(h) * D, R, q0, T);
    tile_load_async<D>(do_buffers + buffer * kTile * ld,
                       dout + static_cast<int64_t>(b) * T * out_stride + static_cast<int64_t>(h) * D, out_stride, q0,
                       T);
    const int query = q0 + tid % kTile;
    const int64_t at = (static_cast<int64_t>(b) * Hq + h) * T + (query < T ? query : 0);
    if (tid < kTile) {
      cp_async_4(lse_buffers + buffer * kTile + tid, lse + at, query < T ? 4 : 0);
    } else {
      cp_async_4(delta_buffers + buffer * kTile + tid - kTile, delta + at, query < T ? 4 : 0);
    }
  };

  tile_load_async<D>(k_tile, batch + static_cast<int64_t>(Hq + kv_head) * D, R, k0, T);
  tile_load_async<D>(v_tile, batch + static_cast<int64_t>(Hq + Hkv + kv_head) * D, R, k0, T);
  load_step(0);
  cp_async_commit();

  // Accumulator row i of this lane: key k0 + 16 warp + g + 8 i; column 8 n + 2t (+1) of D.
  float dk_acc[D / 8][4] = {};
  float dv_acc[D / 8][4] = {};

  for (int step = 0; step < steps; ++step) {
    if constexpr (buffers == 2) {
      // The next step's tiles go to the other buffer, free since the previous step's last barrier.
      if (step + 1 < steps) load_step(step + 1);
      cp_async_commit();
      cp_async_wait<1>();  // this step's tiles (and K, V) have landed
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();

    const int h = kv_head * group + step / q_tiles;
    const int qt = key_tile + step % q_tiles;
    const int q0 = qt * kTile;
    const bf16* q_tile = q_buffers + (step % buffers) * kTile * ld;
    const bf16* do_tile = do_buffers + (step % buffers) * kTile * ld;
    const float* lse_tile = lse_buffers + (step % buffers) * kTile;
    const float* delta_tile = delta_buffers + (step % buffers) * kTile;

    // S^T = K Q^T: 16 keys x 64 queries; n-tile n covers queries q0 + 8 n + [0, 8).
    float s[8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t k_frag[4];
      load_a(k_frag, k_tile, ld, warp * 16, kk * 16);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t qb[4];
        load_b_rows_n(qb, q_tile, ld, np * 16, kk * 16);
        mma_bf16(s[2 * np], k_frag, qb[0], qb[1]);
        mma_bf16(s[2 * np + 1], k_frag, qb[2], qb[3]);
      }
    }
    // P^T = exp(S^T scale - lse): zero above the diagonal (key > query) and for queries >= T,
    // which only the diagonal tile and the last tile hold.
    const bool masked = qt == key_tile || qt == static_cast<int>(gridDim.y) - 1;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int query_local = n * 8 + 2 * t + (e & 1);
        const int query = q0 + query_local, key = k0 + warp * 16 + g + (e >> 1) * 8;
        const float p = exp2f(s[n][e] * log2_scale - lse_tile[query_local] * kLog2e);
        s[n][e] = masked && (key > query || query >= T) ? 0.0f : p;
      }
    }

    // dV += P^T dO: P^T (16 keys x 64 queries) as A fragments from the accumulators.
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint32_t p_frag[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                                  pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                  pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t dob[4];
        load_b_rows_k(dob, do_tile, ld, dp * 16, kk * 16);
        mma_bf16(dv_acc[2 * dp], p_frag, dob[0], dob[1]);
        mma_bf16(dv_acc[2 * dp + 1], p_frag, dob[2], dob[3]);
      }
    }

    // dP^T = V dO^T: 16 keys x 64 queries.
    float dpt[8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t v_frag[4];
      load_a(v_frag, v_tile, ld, warp * 16, kk * 16);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t dob[4];
        load_b_rows_n(dob, do_tile, ld, np * 16, kk * 16);
        mma_bf16(dpt[2 * np], v_frag, dob[0], dob[1]);
        mma_bf16(dpt[2 * np + 1], v_frag, dob[2], dob[3]);
      }
    }
    // dS^T = P^T (dP^T - delta), into dpt and, as bf16, into ds_tile for the dQ product.
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dpt[n][e] = s[n][e] * (dpt[n][e] - delta_tile[n * 8 + 2 * t + (e & 1)]);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        *reinterpret_cast<uint32_t*>(ds_tile + (warp * 16 + g + 8 * i) * ld_s + n * 8 + 2 * t) =
            pack_bf16(dpt[n][2 * i], dpt[n][2 * i + 1]);
      }
    }

    // dK += dS^T Q (the scale is applied once at the end).
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint32_t ds_frag[4] = {pack_bf16(dpt[2 * kk][0], dpt[2 * kk][1]), pack_bf16(dpt[2 * kk][2], dpt[2 * kk][3]),
                                   pack_bf16(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]),
                                   pack_bf16(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t qb[4];
        load_b_rows_k(qb, q_tile, ld, dp * 16, kk * 16);
        mma_bf16(dk_acc[2 * dp], ds_frag, qb[0], qb[1]);
        mma_bf16(dk_acc[2 * dp + 1], ds_frag, qb[2], qb[3]);
      }
    }
    __syncthreads();  // ds_tile is complete

    // dQ (this warp's 16 queries x D) = dS K over the block's 64 keys, added to dq_accum.
    float dq[D / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t ds_frag[4];
      load_a_trans(ds_frag, ds_tile, ld_s, warp * 16, kk * 16);
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t kb[4];
        load_b_rows_k(kb, k_tile, ld, dp * 16, kk * 16);
        mma_bf16(dq[2 * dp], ds_frag, kb[0], kb[1]);
        mma_bf16(dq[2 * dp + 1], ds_frag, kb[2], kb[3]);
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int query = q0 + warp * 16 + g + 8 * i;
      if (query >= T) continue;
      float* dst = dq_accum + (static_cast<int64_t>(b) * T + query) * out_stride + static_cast<int64_t>(h) * D;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) atomic_add_pair(dst + n * 8 + 2 * t, dq[n][2 * i], dq[n][2 * i + 1]);
    }
    __syncthreads();  // this step's buffers and ds_tile are free again
    if constexpr (buffers == 1) {
      if (step + 1 < steps) {
        load_step(step + 1);
        cp_async_commit();
      }
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int key = k0 + warp * 16 + g + 8 * i;
    if (key >= T) continue;
    bf16* row = dqkv + (static_cast<int64_t>(b) * T + key) * R;
    bf16* dk_row = row + static_cast<int64_t>(Hq + kv_head) * D;
    bf16* dv_row = row + static_cast<int64_t>(Hq + Hkv + kv_head) * D;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      *reinterpret_cast<__nv_bfloat162*>(dk_row + n * 8 + 2 * t) =
          __floats2bfloat162_rn(dk_acc[n][2 * i] * scale, dk_acc[n][2 * i + 1] * scale);
      *reinterpret_cast<__nv_bfloat162*>(dv_row + n * 8 + 2 * t) =
          __floats2bfloat162_rn(dv_acc[n][2 * i], dv_acc[n][2 * i + 1]);
    }
  }
}

template <int D>
void attention_backward_launch(bf16* dqkv, float* dq_accum, const bf16* dout, const bf16* qkv, const float* lse,
                               const float* delta, int B, int T, int Hq, int Hkv, float scale, cudaStream_t stream) {
  constexpr int smem_bytes = backward_smem_bytes<D>();
  cuda_check(
      cudaFuncSetAttribute(attention_backward_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes),
      "attention backward: shared memory size");
  const dim3 grid(static_cast<unsigned>(B * Hkv), static_cast<unsigned>(cuda_blocks(T, kTile)));
  attention_backward_kernel<D>
      <<<grid, kThreads, smem_bytes, stream>>>(dqkv, dq_accum, dout, qkv, lse, delta, T, Hq, Hkv, scale);
  cuda_check_launch("attention_backward_kernel");
}

// ---- reference path: one block of kRefThreads per (b, h, query) row, fp32 throughout ----

constexpr int kRefThreads = 128;

__device__ float block_sum(float v, float* scratch) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  __syncthreads();
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  float result = 0.0f;
  for (int w = 0; w < kRefThreads / 32; ++w) result += scratch[w];
  return result;
}

// grid (B Hq T), kRefThreads threads. Writes dq of its row into dqkv and adds its parts of dk and
// dv to kv_accum: (B, T, 2 Hkv D) fp32 (key heads, then value heads).
__global__ void __launch_bounds__(kRefThreads)
    attention_reference_backward_kernel(bf16* dqkv, float* kv_accum, const bf16* dout, const bf16* qkv, const bf16* out,
                                        const float* lse, int T, int Hq, int Hkv, int D, float scale) {
  __shared__ float q[128];
  __shared__ float dout_row[128];
  __shared__ float p[kRefThreads];
  __shared__ float ds[kRefThreads];
  __shared__ float scratch[kRefThreads / 32];
  const int64_t row = blockIdx.x;
  const int query = static_cast<int>(row % T);
  const int bh = static_cast<int>(row / T);
  const int b = bh / Hq, h = bh % Hq, kv_head = h / (Hq / Hkv);
  const int64_t R = static_cast<int64_t>(Hq + 2 * Hkv) * D;
  const bf16* batch = qkv + static_cast<int64_t>(b) * T * R;
  const bf16* k_src = batch + static_cast<int64_t>(Hq + kv_head) * D;
  const bf16* v_src = batch + static_cast<int64_t>(Hq + Hkv + kv_head) * D;
  const int64_t out_at = (static_cast<int64_t>(b) * T + query) * Hq * D + static_cast<int64_t>(h) * D;
  float* kv_batch = kv_accum + static_cast<int64_t>(b) * T * 2 * Hkv * D;
  const int tid = static_cast<int>(threadIdx.x);

  float partial = 0.0f;
  for (int d = tid; d < D; d += kRefThreads) {
    q[d] = __bfloat162float(batch[query * R + h * D + d]);
    dout_row[d] = __bfloat162float(dout[out_at + d]);
    partial += dout_row[d] * __bfloat162float(out[out_at + d]);
  }
  const float delta = block_sum(partial, scratch);  // also orders the shared writes above
  const float row_lse = lse[(static_cast<int64_t>(b) * Hq + h) * T + query];

  float dq = 0.0f;  // element d = tid (tid < D)
  for (int first = 0; first <= query; first += kRefThreads) {
    const int key = first + tid;
    float p_key = 0.0f, ds_key = 0.0f;
    if (key <= query) {
      float score = 0.0f, dp = 0.0f;
      for (int d = 0; d < D; ++d) {
        score += q[d] * __bfloat162float(k_src[key * R + d]);
        dp += dout_row[d] * __bfloat162float(v_src[key * R + d]);
      }
      p_key = expf(score * scale - row_lse);
      ds_key = p_key * (dp - delta);
    }
    p[tid] = p_key;
    ds[tid] = ds_key;
    __syncthreads();
    const int count = min(kRefThreads, query - first + 1);
    if (tid < D) {
      for (int j = 0; j < count; ++j) {
        const int k = first + j;
        dq += ds[j] * __bfloat162float(k_src[k * R + tid]);
        float* kv_row = kv_batch + static_cast<int64_t>(k) * 2 * Hkv * D;
        atomicAdd(kv_row + kv_head * D + tid, ds[j] * q[tid] * scale);
        atomicAdd(kv_row + (Hkv + kv_head) * D + tid, p[j] * dout_row[tid]);
      }
    }
    __syncthreads();
  }
  if (tid < D) dqkv[(static_cast<int64_t>(b) * T + query) * R + h * D + tid] = __float2bfloat16(dq * scale);
}

// kv_accum: (B, T, 2 Hkv D) -> the key and value columns of dqkv: (B, T, R).
__global__ void attention_reference_kv_convert_kernel(bf16* dqkv, const float* kv_accum, int64_t rows, int Hq, int Hkv,
                                                      int D) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t width = 2LL * Hkv * D;
  if (i >= rows * width) return;
  const int64_t row = i / width, col = i % width;
  dqkv[row * (width + static_cast<int64_t>(Hq) * D) + static_cast<int64_t>(Hq) * D + col] =
      __float2bfloat16(kv_accum[i]);
}

}  // namespace

int64_t cuda_attention_reference_backward_workspace_bytes(int B, int T, int Hq, int Hkv, int D) {
  cuda_attention_check_shape(Hq, Hkv, D);
  return round_up_256(static_cast<int64_t>(B) * T * 2 * Hkv * D * 4);
}

void cuda_attention_reference_backward(bf16* dqkv, void* workspace, const bf16* dout, const bf16* qkv, const bf16* out,
                                       const float* lse, int B, int T, int Hq, int Hkv, int D, cudaStream_t stream) {
  attention_check_sizes(B, T, Hq, Hkv, D);
  auto* kv_accum = static_cast<float*>(workspace);
  const int64_t rows = static_cast<int64_t>(B) * T;
  const int64_t kv_elements = rows * 2 * Hkv * D;
  cuda_check(cudaMemsetAsync(kv_accum, 0, static_cast<size_t>(kv_elements) * 4, stream),
             "attention reference backward: clear workspace");
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  attention_reference_backward_kernel<<<static_cast<unsigned>(rows * Hq), kRefThreads, 0, stream>>>(
      dqkv, kv_accum, dout, qkv, out, lse, T, Hq, Hkv, D, scale);
  cuda_check_launch("attention_reference_backward_kernel");
  attention_reference_kv_convert_kernel<<<cuda_blocks(kv_elements, 256), 256, 0, stream>>>(dqkv, kv_accum, rows, Hq,
                                                                                           Hkv, D);
  cuda_check_launch("attention_reference_kv_convert_kernel");
}

int64_t cuda_attention_backward_workspace_bytes(int B, int T, int Hq, int Hkv, int D) {
  if (attention_path_from_environment() == AttentionPath::AttentionPath_reference) {
    return cuda_attention_reference_backward_workspace_bytes(B, T, Hq, Hkv, D);
  }
  cuda_attention_check_shape(Hq, Hkv, D);
  const int64_t dq_bytes = round_up_256(static_cast<int64_t>(B) * T * Hq * D * 4);
  const int64_t delta_bytes = round_up_256(static_cast<int64_t>(B) * Hq * T * 4);
  return dq_bytes + delta_bytes;
}

void cuda_attention_backward(bf16* dqkv, void* workspace, const bf16* dout, const bf16* qkv, const bf16* out,
                             const float* lse, int B, int T, int Hq, int Hkv, int D, cudaStream_t stream) {
  if (attention_path_from_environment() == AttentionPath::AttentionPath_reference) {
    cuda_attention_reference_backward(dqkv, workspace, dout, qkv, out, lse, B, T, Hq, Hkv, D, stream);
    return;
  }
  attention_check_sizes(B, T, Hq, Hkv, D);
  attention_check_aligned(qkv, 16, "qkv");
  attention_check_aligned(dout, 16, "dout");
  attention_check_aligned(dqkv, 4, "dqkv");
  attention_check_aligned(workspace, 256, "workspace");
  const int64_t rows = static_cast<int64_t>(B) * T;
  const int64_t dq_elements = rows * Hq * D;
  auto* dq_accum = static_cast<float*>(workspace);
  auto* delta = reinterpret_cast<float*>(static_cast<char*>(workspace) + round_up_256(dq_elements * 4));
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

  cuda_check(cudaMemsetAsync(dq_accum, 0, static_cast<size_t>(dq_elements) * 4, stream),
             "attention backward: clear dq accumulator");
  constexpr int kDeltaWarps = 8;
  attention_delta_kernel<<<cuda_blocks(rows * Hq, kDeltaWarps), 32 * kDeltaWarps, 0, stream>>>(delta, dout, out, B, T,
                                                                                               Hq, D);
  cuda_check_launch("attention_delta_kernel");
  if (D == 64) {
    attention_backward_launch<64>(dqkv, dq_accum, dout, qkv, lse, delta, B, T, Hq, Hkv, scale, stream);
  } else {
    attention_backward_launch<128>(dqkv, dq_accum, dout, qkv, lse, delta, B, T, Hq, Hkv, scale, stream);
  }
  attention_dq_convert_kernel<<<cuda_blocks(dq_elements, 256), 256, 0, stream>>>(dqkv, dq_accum, rows, Hq, Hkv, D,
                                                                                 scale);
  cuda_check_launch("attention_dq_convert_kernel");
}

}  // namespace alloy
