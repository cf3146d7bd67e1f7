// cuBLASLt linear layers against the CPU's OpenBLAS ones on the same bf16-rounded inputs:
// forward with bias and residual, padded output rows, and both backward products, accumulating
// and not, on aligned and odd shapes.
#include <gtest/gtest.h>

#include <string>

#include "cuda_test_util.hpp"
#include "runtime/cpu/matmul.hpp"
#include "runtime/cuda/matmul.hpp"

namespace alloy {
namespace {

using testing::DeviceBuffer;
using testing::random_floats;
using testing::round_bf16;
using testing::to_bf16;
using testing::to_float;
using testing::tolerance_ratio;

struct Shape {
  int N, K, M, ldo;
};

class MatmulTest : public ::testing::TestWithParam<Shape> {};

TEST_P(MatmulTest, ForwardWithBiasAndResidualMatchesCpu) {
  ALLOY_REQUIRE_GPU();
  const Shape s = GetParam();
  const auto inp = round_bf16(random_floats(int64_t{s.N} * s.K, 1.0f, 1));
  const auto w = round_bf16(random_floats(int64_t{s.M} * s.K, 0.1f, 2));
  const auto b = round_bf16(random_floats(s.M, 0.5f, 3));
  const auto residual = round_bf16(random_floats(int64_t{s.N} * s.ldo, 1.0f, 4));
  std::vector<float> expected(static_cast<size_t>(s.N) * s.M);
  matmul_forward(expected.data(), inp.data(), w.data(), b.data(), s.N, s.K, s.M);
  for (int n = 0; n < s.N; ++n)
    for (int m = 0; m < s.M; ++m) expected[static_cast<size_t>(n) * s.M + m] += residual[static_cast<size_t>(n) * s.ldo + m];

  DeviceBuffer<bf16> d_inp(to_bf16(inp)), d_w(to_bf16(w)), d_b(to_bf16(b)), d_out(to_bf16(residual));
  CudaMatmul matmul;
  matmul.forward(d_out.get(), d_inp.get(), d_w.get(), d_b.get(), d_out.get(), s.N, s.K, s.M, s.ldo, nullptr);
  const std::vector<float> out = to_float(d_out.download());
  std::vector<float> got(expected.size());
  for (int n = 0; n < s.N; ++n) {
    for (int m = 0; m < s.M; ++m) got[static_cast<size_t>(n) * s.M + m] = out[static_cast<size_t>(n) * s.ldo + m];
    for (int m = s.M; m < s.ldo; ++m) {  // the padding columns are left alone
      EXPECT_EQ(out[static_cast<size_t>(n) * s.ldo + m], residual[static_cast<size_t>(n) * s.ldo + m]);
    }
  }
  EXPECT_LE(tolerance_ratio(got, expected, 2e-2, 1e-2), 1.0);
}

TEST_P(MatmulTest, BackwardProductsMatchCpu) {
  ALLOY_REQUIRE_GPU();
  const Shape s = GetParam();
  const auto inp = round_bf16(random_floats(int64_t{s.N} * s.K, 1.0f, 5));
  const auto w = round_bf16(random_floats(int64_t{s.M} * s.K, 0.1f, 6));
  const auto dout_dense = round_bf16(random_floats(int64_t{s.N} * s.M, 1.0f, 7));
  std::vector<float> dout_padded(static_cast<size_t>(s.N) * s.ldo, 0.0f);
  for (int n = 0; n < s.N; ++n)
    for (int m = 0; m < s.M; ++m)
      dout_padded[static_cast<size_t>(n) * s.ldo + m] = dout_dense[static_cast<size_t>(n) * s.M + m];
  const auto dinp_start = round_bf16(random_floats(int64_t{s.N} * s.K, 1.0f, 8));
  const auto dw_start = random_floats(int64_t{s.M} * s.K, 1.0f, 9);

  std::vector<float> dinp_expected = dinp_start, dw_expected = dw_start;
  matmul_backward(dinp_expected.data(), dw_expected.data(), nullptr, dout_dense.data(), inp.data(), w.data(), s.N, s.K,
                  s.M);
  std::vector<float> dinp_fresh(dinp_start.size(), 0.0f);
  std::vector<float> unused_dw(dw_start.size(), 0.0f);
  matmul_backward(dinp_fresh.data(), unused_dw.data(), nullptr, dout_dense.data(), inp.data(), w.data(), s.N, s.K, s.M);

  DeviceBuffer<bf16> d_inp(to_bf16(inp)), d_w(to_bf16(w)), d_dout(to_bf16(dout_padded));
  DeviceBuffer<bf16> d_dinp(to_bf16(dinp_start)), d_fresh(to_bf16(dinp_start));
  DeviceBuffer<float> d_dw(dw_start);
  CudaMatmul matmul;
  matmul.backward_input(d_dinp.get(), d_dout.get(), d_w.get(), s.N, s.K, s.M, s.ldo, true, nullptr);
  matmul.backward_input(d_fresh.get(), d_dout.get(), d_w.get(), s.N, s.K, s.M, s.ldo, false, nullptr);
  matmul.backward_weight(d_dw.get(), d_dout.get(), d_inp.get(), s.N, s.K, s.M, s.ldo, nullptr);
  EXPECT_LE(tolerance_ratio(to_float(d_dinp.download()), dinp_expected, 2e-2, 1e-2), 1.0);
  EXPECT_LE(tolerance_ratio(to_float(d_fresh.download()), dinp_fresh, 2e-2, 1e-2), 1.0);
  EXPECT_LE(tolerance_ratio(d_dw.download(), dw_expected, 1e-3, 1e-3), 1.0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, MatmulTest,
                         ::testing::Values(Shape{64, 128, 96, 96}, Shape{256, 768, 2304, 2304},
                                           Shape{37, 72, 45, 64}, Shape{130, 64, 300, 320}),
                         [](const ::testing::TestParamInfo<Shape>& param_info) {
                           const Shape& s = param_info.param;
                           return "N" + std::to_string(s.N) + "_K" + std::to_string(s.K) + "_M" + std::to_string(s.M) +
                                  "_ld" + std::to_string(s.ldo);
                         });

TEST(MatmulPeak, MeasuresAPlausibleRate) {
  ALLOY_REQUIRE_GPU();
  CudaMatmul matmul;
  const double flops = cuda_matmul_peak_flops(matmul, 2048, 3);
  EXPECT_GT(flops, 1e12);   // any tensor-core GPU does more than 1 TFLOP/s in bf16
  EXPECT_LT(flops, 1e16);
}

}  // namespace
}  // namespace alloy
