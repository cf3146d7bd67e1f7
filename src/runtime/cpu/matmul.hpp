// Linear layers through OpenBLAS: y = x W^T + b with W stored (out, in) row-major, like
// torch.nn.Linear.
#pragma once

namespace alloy {

// inp: (N, C)  w: (OC, C)  b: (OC) or nullptr  ->  out: (N, OC)
void matmul_forward(float* out, const float* inp, const float* w, const float* b, int N, int C,
                    int OC);

// dout: (N, OC) -> dinp: (N, C) += dout W, dw: (OC, C) += dout^T inp, db: (OC) += column sums.
// dinp, dw or db may be nullptr to skip them.
void matmul_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                     const float* w, int N, int C, int OC);

// Rows [row_begin, row_end) of matmul_backward's dw and db: dw_rows (row_end - row_begin, C) +=,
// db_rows (row_end - row_begin) += (skipped when nullptr).
void matmul_backward_weight_rows(float* dw_rows, float* db_rows, const float* dout, const float* inp,
                                 int N, int C, int OC, int row_begin, int row_end);

// dout: (N, OC) -> db: (OC) += column sums (matmul_backward's db alone).
void matmul_backward_bias(float* db, const float* dout, int N, int OC);

}  // namespace alloy
