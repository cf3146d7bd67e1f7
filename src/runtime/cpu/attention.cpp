// Attention per (batch, head) with two GEMMs and a masked softmax; heads run in parallel with
// OpenMP, each GEMM single-threaded in OpenBLAS (see runtime/threads.hpp).
// Partial redundancy elimination turns exp_fast's clamps into branches that stop the `omp simd`
// loops from vectorising (GCC 12, -O2); this file's kernels are faster without it.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-tree-pre")
#endif

#include "runtime/cpu/attention.hpp"
#include "runtime/cpu/fastmath.hpp"
#include "runtime/cpu/parallel.hpp"
#include "runtime/profile.hpp"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>


namespace alloy {

namespace {

// (T, D/2) tables of cos and sin of t * inverse[i], computed in double.
void rope_tables(std::vector<float>& cos_table, std::vector<float>& sin_table, int T, int D,
                 const double* inverse) {
  const int half = D / 2;
  cos_table.resize(static_cast<size_t>(T) * half);
  sin_table.resize(static_cast<size_t>(T) * half);
  for (int i = 0; i < half; i++) {
    for (int t = 0; t < T; t++) {
      cos_table[static_cast<size_t>(t) * half + i] = static_cast<float>(std::cos(t * inverse[i]));
      sin_table[static_cast<size_t>(t) * half + i] = static_cast<float>(std::sin(t * inverse[i]));
    }
  }
}

// The tables of the last (T, frequencies) this thread asked for: every layer's forward and
// backward of a step asks for the same ones, and computing them took about 3% of a LLaMA step.
struct RopeTables {
  int T = 0;
  std::vector<double> inverse;
  std::vector<float> cos_table, sin_table;
};

const RopeTables& rope_tables_cached(int T, int D, const double* inverse) {
  thread_local RopeTables cached;
  const bool same = cached.T == T && cached.inverse.size() == static_cast<size_t>(D / 2) &&
                    std::equal(cached.inverse.begin(), cached.inverse.end(), inverse);
  if (!same) {
    rope_tables(cached.cos_table, cached.sin_table, T, D, inverse);
    cached.T = T;
    cached.inverse.assign(inverse, inverse + D / 2);
  }
  return cached;
}

// sign +1: forward rotation; -1: its transpose (backward).
void rope_apply(float* qkv, int B, int T, int Hq, int Hkv, int D, const double* inverse, float sign) {
  const RopeTables& tables = rope_tables_cached(T, D, inverse);
  const std::vector<float>& cos_table = tables.cos_table;
  const std::vector<float>& sin_table = tables.sin_table;
  const int half = D / 2;
  const int64_t R = static_cast<int64_t>(Hq + 2 * Hkv) * D;
  const int rotated_heads = Hq + Hkv;
  const int64_t rows = static_cast<int64_t>(B) * T;
#pragma omp parallel for schedule(static) if (rows * R >= kParallelMinElements)
  for (int64_t bt = 0; bt < rows; bt++) {
    const float* c = cos_table.data() + (bt % T) * half;
    const float* s = sin_table.data() + (bt % T) * half;
    for (int h = 0; h < rotated_heads; h++) {
      float* x = qkv + bt * R + static_cast<int64_t>(h) * D;
      for (int i = 0; i < half; i++) {
        const float x1 = x[i];
        const float x2 = x[i + half];
        x[i] = x1 * c[i] - sign * x2 * s[i];
        x[i + half] = x2 * c[i] + sign * x1 * s[i];
      }
    }
  }
}

// The first key column row t sees: 0, or with a sliding window of `window` keys t - window + 1.
inline int first_visible(int t, int window) { return window > 0 && t >= window ? t - window + 1 : 0; }

// Row t of a causal score matrix: softmax over columns first..t, zeros elsewhere.
ALLOY_VECTOR_CLONES
void causal_softmax_row(float* row, int first, int t, int T) {
  float max_value = row[first];
#pragma omp simd reduction(max : max_value)
  for (int j = first; j <= t; j++) max_value = row[j] > max_value ? row[j] : max_value;
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int j = first; j <= t; j++) {
    row[j] = exp_fast(row[j] - max_value);
    sum += row[j];
  }
  const float inv_sum = 1.0f / sum;
#pragma omp simd
  for (int j = first; j <= t; j++) row[j] *= inv_sum;
  for (int j = 0; j < first; j++) row[j] = 0.0f;
  for (int j = t + 1; j < T; j++) row[j] = 0.0f;
}

// Row t of dP -> dS = P * (dP - sum(P * dP)) over columns first..t, zeros elsewhere.
ALLOY_VECTOR_CLONES
void softmax_backward_row(float* dp_row, const float* p_row, int first, int t, int T) {
  float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
  for (int j = first; j <= t; j++) dot += p_row[j] * dp_row[j];
#pragma omp simd
  for (int j = first; j <= t; j++) dp_row[j] = p_row[j] * (dp_row[j] - dot);
  for (int j = 0; j < first; j++) dp_row[j] = 0.0f;
  for (int j = t + 1; j < T; j++) dp_row[j] = 0.0f;
}

}  // namespace

std::vector<double> rope_inverse_frequencies(int D, double theta) {
  std::vector<double> inverse(static_cast<size_t>(D / 2));
  for (int i = 0; i < D / 2; i++) inverse[static_cast<size_t>(i)] = std::pow(theta, -2.0 * i / D);
  return inverse;
}

void rope_forward(float* qkv, int B, int T, int Hq, int Hkv, int D, const double* inverse_frequencies) {
  ProfileScope profile(KernelKind::KernelKind_elementwise);
  rope_apply(qkv, B, T, Hq, Hkv, D, inverse_frequencies, 1.0f);
}

void rope_backward(float* dqkv, int B, int T, int Hq, int Hkv, int D, const double* inverse_frequencies) {
  ProfileScope profile(KernelKind::KernelKind_elementwise);
  rope_apply(dqkv, B, T, Hq, Hkv, D, inverse_frequencies, -1.0f);
}

// Query rows are processed in blocks: block [r0, r1) only needs key columns [0, r1), which skips
// most of the masked upper triangle in every GEMM (T = 128: 3/4 of the full work).
constexpr int kAttentionRowBlock = 64;

void attention_forward(float* out, float* probs, const float* qkv, int B, int T, int Hq, int Hkv,
                       int D, int window) {
  ProfileScope profile(KernelKind::KernelKind_attention);
  const int64_t R = static_cast<int64_t>(Hq + 2 * Hkv) * D;
  const int64_t out_stride = static_cast<int64_t>(Hq) * D;
  const int group = Hq / Hkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t macs = int64_t{B} * Hq * T * T * D;
#pragma omp parallel for collapse(2) schedule(static) if (macs >= kParallelMinMacs)
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < Hq; h++) {
      const float* base = qkv + static_cast<int64_t>(b) * T * R;
      const float* q = base + static_cast<int64_t>(h) * D;
      const float* k = base + static_cast<int64_t>(Hq + h / group) * D;
      const float* v = base + static_cast<int64_t>(Hq + Hkv + h / group) * D;
      float* p = probs + (static_cast<int64_t>(b) * Hq + h) * T * T;
      float* o = out + static_cast<int64_t>(b) * T * out_stride + static_cast<int64_t>(h) * D;
      for (int r0 = 0; r0 < T; r0 += kAttentionRowBlock) {
        const int r1 = r0 + kAttentionRowBlock < T ? r0 + kAttentionRowBlock : T;
        float* p_block = p + static_cast<int64_t>(r0) * T;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, r1, D, scale, q + r0 * R, R,
                    k, R, 0.0f, p_block, T);
        for (int t = r0; t < r1; t++)
          causal_softmax_row(p + static_cast<int64_t>(t) * T, first_visible(t, window), t, T);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, D, r1, 1.0f, p_block, T,
                    v, R, 0.0f, o + r0 * out_stride, out_stride);
      }
    }
  }
}

int64_t attention_backward_scratch_floats(int T) {
  return static_cast<int64_t>(omp_get_max_threads()) * T * T;
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* probs,
                        const float* qkv, int B, int T, int Hq, int Hkv, int D, int window) {
  ProfileScope profile(KernelKind::KernelKind_attention);
  const int64_t R = static_cast<int64_t>(Hq + 2 * Hkv) * D;
  const int64_t out_stride = static_cast<int64_t>(Hq) * D;
  const int group = Hq / Hkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t macs = int64_t{B} * Hq * T * T * D;
  // One task per (batch, kv head): the query heads sharing a kv head add into the same dk, dv.
#pragma omp parallel for collapse(2) schedule(static) if (macs >= kParallelMinMacs)
  for (int b = 0; b < B; b++) {
    for (int kvh = 0; kvh < Hkv; kvh++) {
      float* dp = scratch + static_cast<int64_t>(omp_get_thread_num()) * T * T;
      const float* base = qkv + static_cast<int64_t>(b) * T * R;
      float* dbase = dqkv + static_cast<int64_t>(b) * T * R;
      const float* k = base + static_cast<int64_t>(Hq + kvh) * D;
      const float* v = base + static_cast<int64_t>(Hq + Hkv + kvh) * D;
      float* dk = dbase + static_cast<int64_t>(Hq + kvh) * D;
      float* dv = dbase + static_cast<int64_t>(Hq + Hkv + kvh) * D;
      for (int h = kvh * group; h < (kvh + 1) * group; h++) {
        const float* q = base + static_cast<int64_t>(h) * D;
        float* dq = dbase + static_cast<int64_t>(h) * D;
        const float* p = probs + (static_cast<int64_t>(b) * Hq + h) * T * T;
        const float* dout_h =
            dout + static_cast<int64_t>(b) * T * out_stride + static_cast<int64_t>(h) * D;
        for (int r0 = 0; r0 < T; r0 += kAttentionRowBlock) {
          const int r1 = r0 + kAttentionRowBlock < T ? r0 + kAttentionRowBlock : T;
          const float* p_block = p + static_cast<int64_t>(r0) * T;
          float* dp_block = dp + static_cast<int64_t>(r0) * T;
          const float* dout_block = dout_h + r0 * out_stride;
          // dP = dO V^T and dV += P^T dO over the block's rows and its visible columns [0, r1)
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, r1, D, 1.0f, dout_block,
                      out_stride, v, R, 0.0f, dp_block, T);
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, D, r1 - r0, 1.0f, p_block, T,
                      dout_block, out_stride, 1.0f, dv, R);
          for (int t = r0; t < r1; t++) {
            softmax_backward_row(dp + static_cast<int64_t>(t) * T, p + static_cast<int64_t>(t) * T,
                                 first_visible(t, window), t, T);
          }
          // dQ += dS K / sqrt(D) and dK += dS^T Q / sqrt(D)
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, D, r1, scale, dp_block,
                      T, k, R, 1.0f, dq + r0 * R, R);
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, D, r1 - r0, scale, dp_block, T,
                      q + r0 * R, R, 1.0f, dk, R);
        }
      }
    }
  }
}

}  // namespace alloy
