// Linear layers: each OpenMP thread runs a single-threaded cblas_sgemm on its slice (rows of the
// output), so one thread pool serves GEMMs and elementwise loops alike (no spinning OpenMP
// workers competing with OpenBLAS's own threads for the same cores).
#include "runtime/cpu/matmul.hpp"
#include "runtime/cpu/parallel.hpp"
#include "runtime/profile.hpp"

#include <cblas.h>
#include <omp.h>

#include <cstdint>
#include <cstring>

namespace alloy {

namespace {

// Slice [begin, end) of `extent` for thread `index` of `count`, in multiples of 16 rows.
void thread_slice(int extent, int index, int count, int& begin, int& end) {
  const int blocks = (extent + 15) / 16;
  const int first = blocks * index / count;
  const int last = blocks * (index + 1) / count;
  begin = first * 16 < extent ? first * 16 : extent;
  end = last * 16 < extent ? last * 16 : extent;
}

}  // namespace

void matmul_forward(float* out, const float* inp, const float* w, const float* b, int N, int C,
                    int OC) {
  ProfileScope profile(KernelKind::KernelKind_matmul);
#pragma omp parallel if (int64_t{N} * C * OC >= kParallelMinMacs)
  {
    int begin = 0;
    int end = 0;
    thread_slice(N, omp_get_thread_num(), omp_get_num_threads(), begin, end);
    if (end > begin) {
      float* rows = out + static_cast<int64_t>(begin) * OC;
      float beta = 0.0f;
      if (b != nullptr) {
        for (int n = 0; n < end - begin; n++) {
          std::memcpy(rows + static_cast<int64_t>(n) * OC, b, static_cast<size_t>(OC) * 4);
        }
        beta = 1.0f;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, end - begin, OC, C, 1.0f,
                  inp + static_cast<int64_t>(begin) * C, C, w, C, beta, rows, OC);
    }
  }
}

void matmul_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                     const float* w, int N, int C, int OC) {
  ProfileScope profile(KernelKind::KernelKind_matmul);
  if (dinp != nullptr) {
#pragma omp parallel if (int64_t{N} * C * OC >= kParallelMinMacs)
    {
      int begin = 0;
      int end = 0;
      thread_slice(N, omp_get_thread_num(), omp_get_num_threads(), begin, end);
      if (end > begin) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, end - begin, C, OC, 1.0f,
                    dout + static_cast<int64_t>(begin) * OC, OC, w, C, 1.0f,
                    dinp + static_cast<int64_t>(begin) * C, C);
      }
    }
  }
  if (dw != nullptr) {
    matmul_backward_weight_rows(dw, db, dout, inp, N, C, OC, 0, OC);
  } else if (db != nullptr) {
    matmul_backward_bias(db, dout, N, OC);
  }
}

void matmul_backward_weight_rows(float* dw_rows, float* db_rows, const float* dout, const float* inp,
                                 int N, int C, int OC, int row_begin, int row_end) {
  ProfileScope profile(KernelKind::KernelKind_matmul);
  const int rows = row_end - row_begin;
#pragma omp parallel if (int64_t{N} * C * rows >= kParallelMinMacs)
  {
    int begin = 0;
    int end = 0;
    thread_slice(rows, omp_get_thread_num(), omp_get_num_threads(), begin, end);
    if (end > begin) {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, end - begin, C, N, 1.0f,
                  dout + row_begin + begin, OC, inp, C, 1.0f,
                  dw_rows + static_cast<int64_t>(begin) * C, C);
      if (db_rows != nullptr) {
        for (int n = 0; n < N; n++) {
          const float* row = dout + static_cast<int64_t>(n) * OC + row_begin;
#pragma omp simd
          for (int o = begin; o < end; o++) db_rows[o] += row[o];
        }
      }
    }
  }
}

void matmul_backward_bias(float* db, const float* dout, int N, int OC) {
  for (int n = 0; n < N; n++) {
    const float* row = dout + static_cast<int64_t>(n) * OC;
#pragma omp simd
    for (int o = 0; o < OC; o++) db[o] += row[o];
  }
}

}  // namespace alloy
