// Linear layers through OpenBLAS: y = x W^T + b with W stored (out, in) row-major, like
// torch.nn.Linear.
#pragma once

namespace alloy {

// inp: (N, C)  w: (OC, C)  b: (OC) or nullptr  ->  out: (N, OC)
void matmul_forward(float* out, const float* inp, const float* w, const float* b, int N, int C,
                    int OC);

// dout: (N, OC) -> dinp: (N, C) += dout W, dw: (OC, C) += dout^T inp, db: (OC) += column sums.
// dinp or db may be nullptr to skip them.
void matmul_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                     const float* w, int N, int C, int OC);

}  // namespace alloy
