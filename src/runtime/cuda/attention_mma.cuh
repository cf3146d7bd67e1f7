// Warp-level tensor-core pieces shared by the fused attention kernels (attention_forward.cu,
// attention_backward.cu): the bf16 m16n8k16 mma with fp32 accumulators, ldmatrix loads of its
// fragments from padded shared-memory tiles, cp.async staging of (64, D) tiles from global memory,
// and the choice between the fast kernels and the plain reference ones (ALLOY_CUDA_ATTENTION).
#pragma once

#include <cstdint>
#include <cstring>

#include "runtime/cuda/cuda_check.hpp"

namespace alloy::attention_detail {

// Rows of every tile (queries per forward block, keys per backward block, and the tiles of the
// other side they loop over); one block is 4 warps, each owning 16 of the 64 rows.
constexpr int kTile = 64;
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Shared tiles are row-major with rows padded by 8 bf16 (16 bytes): a row of D = 64 (128) then
// spans 36 (68) words, so the 8 row addresses of one ldmatrix phase fall on distinct 16-byte bank
// groups, and every row start stays 16-byte aligned as ldmatrix and cp.async need.
template <int Cols>
constexpr int padded_cols() {
  return Cols + 8;
}

// Fragment layouts of mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (PTX ISA). Lane
// l = 4 g + t (g = l / 4, t = l % 4); a 32-bit A or B register holds two bf16 that are adjacent
// along k, the lower k in the low half:
//   A (16 x 16, A[m][k]): a0 = A[g][2t, 2t+1]    a1 = A[g+8][2t, 2t+1]
//                         a2 = A[g][2t+8, 2t+9]  a3 = A[g+8][2t+8, 2t+9]
//   B (16 x 8,  B[k][n]): b0 = B[2t, 2t+1][g]    b1 = B[2t+8, 2t+9][g]
//   C (16 x 8,  fp32):    c0, c1 = C[g][2t, 2t+1]   c2, c3 = C[g+8][2t, 2t+1]
// Hence the fp32 C tiles of columns [16k, 16k+8) and [16k+8, 16k+16) of a 16-row product, packed
// to bf16 as {pack(c0, c1), pack(c2, c3)} of the first then of the second, are the A fragment of
// k-step k when that product is the left operand of the next one (P V, dS Q, P^T dO).
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as bf16 in one register, lo in the low half (the lower k or column).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t bits;
  memcpy(&bits, &v, sizeof(bits));
  return bits;
}

// ldmatrix.x4: lanes 8j .. 8j+7 give the addresses of rows 0..7 of 8x8 matrix j (16 bytes each);
// register j then holds M_j[g][2t, 2t+1], or with .trans M_j[2t][g] and M_j[2t+1][g].
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* row) {
  const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* row) {
  const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// The four fragment loads, from a row-major shared tile X with `ld` elements per row. With
// j = lane / 8 and r = lane % 8 each lane addresses one row of matrix j:
//
// A fragment of A = X[m0 .. m0+16)[k0 .. k0+16): matrix j = rows m0 + 8 (j & 1), columns
// k0 + 8 (j >> 1), so registers 0..3 are a0..a3.
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* x, int ld, int m0, int k0) {
  const int lane = static_cast<int>(threadIdx.x % 32), j = lane / 8, r = lane % 8;
  ldmatrix_x4(a, x + (m0 + r + (j & 1) * 8) * ld + k0 + (j >> 1) * 8);
}
// A fragment of A = X^T, i.e. A[m][k] = X[k][m] for m in [m0, m0+16), k in [k0, k0+16): matrix j
// (transposed) = X rows k0 + 8 (j >> 1), columns m0 + 8 (j & 1), giving a0..a3.
__device__ __forceinline__ void load_a_trans(uint32_t (&a)[4], const bf16* x, int ld, int m0, int k0) {
  const int lane = static_cast<int>(threadIdx.x % 32), j = lane / 8, r = lane % 8;
  ldmatrix_x4_trans(a, x + (k0 + r + (j >> 1) * 8) * ld + m0 + (j & 1) * 8);
}
// B fragments of two adjacent n-tiles where B[k][n] = X[n][k] (X holds one row per n: K for
// Q K^T), n in [n0, n0+16), k in [k0, k0+16): matrix j = X rows n0 + 8 (j >> 1), columns
// k0 + 8 (j & 1). Registers: b[0], b[1] = b0, b1 of n-tile n0; b[2], b[3] those of n0 + 8.
__device__ __forceinline__ void load_b_rows_n(uint32_t (&b)[4], const bf16* x, int ld, int n0, int k0) {
  const int lane = static_cast<int>(threadIdx.x % 32), j = lane / 8, r = lane % 8;
  ldmatrix_x4(b, x + (n0 + r + (j >> 1) * 8) * ld + k0 + (j & 1) * 8);
}
// B fragments of two adjacent n-tiles where B[k][n] = X[k][n] (X holds one row per k: V for P V):
// matrix j (transposed) = X rows k0 + 8 (j & 1), columns n0 + 8 (j >> 1). Registers as above.
__device__ __forceinline__ void load_b_rows_k(uint32_t (&b)[4], const bf16* x, int ld, int n0, int k0) {
  const int lane = static_cast<int>(threadIdx.x % 32), j = lane / 8, r = lane % 8;
  ldmatrix_x4_trans(b, x + (k0 + r + (j & 1) * 8) * ld + n0 + (j >> 1) * 8);
}

// 16 bytes global -> shared without passing through registers; src_bytes = 0 fills zeros (rows
// past T), in which case src must still be a valid address.
__device__ __forceinline__ void cp_async_16(bf16* dst, const bf16* src, int src_bytes) {
  const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(src), "r"(src_bytes));
}
// 4 bytes, for vectors whose rows need not be 16-byte aligned; src_bytes = 0 fills zeros.
__device__ __forceinline__ void cp_async_4(float* dst, const float* src, int src_bytes) {
  const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(address), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most `Pending` of this thread's committed groups are still in flight.
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
}

// Issues the copies of a (64, D) tile: tile row r <- global row `row0 + r` at src + row * stride
// (elements); rows >= T become zeros. All threads of the block take part; the caller commits.
template <int D>
__device__ __forceinline__ void tile_load_async(bf16* tile, const bf16* src, int64_t stride, int row0, int T) {
  constexpr int kChunksPerRow = D / 8;
  constexpr int ld = padded_cols<D>();
  for (int chunk = static_cast<int>(threadIdx.x); chunk < kTile * kChunksPerRow; chunk += kThreads) {
    const int r = chunk / kChunksPerRow, c = (chunk % kChunksPerRow) * 8;
    const int row = row0 + r;
    const bool valid = row < T;
    cp_async_16(tile + r * ld + c, src + (valid ? row : 0) * stride + c, valid ? 16 : 0);
  }
}

}  // namespace alloy::attention_detail

namespace alloy {

enum class AttentionPath { AttentionPath_fast, AttentionPath_reference };

// The path ALLOY_CUDA_ATTENTION selects: unset, empty or "fast" -> fast; "reference" ->
// reference; anything else throws alloy::Error.
AttentionPath attention_path_from_environment();

// Throws alloy::Error unless the shape is supported (cuda_attention_check_shape), B, T >= 1, and
// the grids (B Hq T reference blocks, ceil(T / 64) query or key tiles) fit one launch.
void attention_check_sizes(int B, int T, int Hq, int Hkv, int D);

// Throws alloy::Error naming `what` unless pointer is a multiple of alignment_bytes: the fast
// kernels copy 16-byte chunks of qkv and dout and store pairs into out and dqkv.
void attention_check_aligned(const void* pointer, int alignment_bytes, const char* what);

}  // namespace alloy
