// Linear layers: all heavy lifting in cblas_sgemm (threaded by OpenBLAS itself).
#include "runtime/cpu/matmul.hpp"

#include <cblas.h>

#include <cstdint>

namespace alloy {

void matmul_forward(float* out, const float* inp, const float* w, const float* b, int N, int C,
                    int OC) {
  float beta = 0.0f;
  if (b != nullptr) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
      float* row = out + static_cast<int64_t>(n) * OC;
      for (int o = 0; o < OC; o++) row[o] = b[o];
    }
    beta = 1.0f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, w, C, beta, out,
              OC);
}

void matmul_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                     const float* w, int N, int C, int OC) {
  if (dinp != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, w, C, 1.0f,
                dinp, C);
  }
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw,
              C);
  if (db != nullptr) {
    for (int n = 0; n < N; n++) {
      const float* row = dout + static_cast<int64_t>(n) * OC;
      for (int o = 0; o < OC; o++) db[o] += row[o];
    }
  }
}

}  // namespace alloy
