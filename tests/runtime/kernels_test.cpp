// Every CPU kernel: forward against a naive double-precision reference, backward against central
// finite differences of the forward (and backward kernels must accumulate, not overwrite).
#include <chrono>
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <numbers>

#include "runtime/cpu/activation.hpp"
#include "runtime/cpu/embedding.hpp"
#include "runtime/cpu/loss.hpp"
#include "runtime/cpu/matmul.hpp"
#include "runtime/cpu/norm.hpp"
#include "runtime/profile.hpp"
#include "runtime/threads.hpp"
#include "gradcheck.hpp"

namespace alloy {
namespace {

using testing::expect_gradient_matches;
using testing::max_relative_difference;
using testing::random_vector;
using testing::weighted_sum;

// Backward kernels add into gradients: start them at a known non-zero value, then subtract it.
std::vector<float> accumulated_part(const std::vector<float>& gradient, float start) {
  std::vector<float> part(gradient);
  for (float& g : part) g -= start;
  return part;
}

constexpr float kStart = 0.25f;

TEST(Kernels, EmbeddingForwardAndBackward) {
  const int B = 2, T = 3, C = 5, V = 7;
  std::vector<int32_t> tokens = {1, 4, 6, 1, 0, 3};  // token 1 twice: the scatter-add must sum
  auto wte = random_vector(V * C, 1);
  auto wpe = random_vector(T * C, 2);
  std::vector<float> out(B * T * C);
  embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  for (int bt = 0; bt < B * T; bt++) {
    for (int c = 0; c < C; c++) {
      EXPECT_FLOAT_EQ(out[bt * C + c], wte[tokens[bt] * C + c] + wpe[(bt % T) * C + c]);
    }
  }
  auto dout = random_vector(out.size(), 3);
  std::vector<float> dwte(wte.size(), kStart), dwpe(wpe.size(), kStart);
  embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
  auto loss = [&] {
    embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    return weighted_sum(out, dout);
  };
  expect_gradient_matches("embedding dwte", wte, accumulated_part(dwte, kStart), loss);
  expect_gradient_matches("embedding dwpe", wpe, accumulated_part(dwpe, kStart), loss);
}

TEST(Kernels, LayerNormForwardAndBackward) {
  const int N = 6, C = 16;
  const float eps = 1e-5f;
  auto x = random_vector(N * C, 4, 2.0f);
  auto w = random_vector(C, 5);
  auto b = random_vector(C, 6);
  std::vector<float> out(N * C), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, eps);
  std::vector<double> reference(N * C);
  for (int n = 0; n < N; n++) {
    double m = 0.0, var = 0.0;
    for (int c = 0; c < C; c++) m += x[n * C + c];
    m /= C;
    for (int c = 0; c < C; c++) var += (x[n * C + c] - m) * (x[n * C + c] - m);
    var /= C;
    for (int c = 0; c < C; c++) {
      reference[n * C + c] = (x[n * C + c] - m) / std::sqrt(var + eps) * w[c] + b[c];
    }
  }
  EXPECT_LT(max_relative_difference(out.data(), reference.data(), out.size()), 1e-5);

  auto dout = random_vector(out.size(), 7);
  std::vector<float> dx(x.size(), kStart), dw(C, kStart), db(C, kStart);
  layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), N, C);
  auto loss = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                      eps);
    return weighted_sum(out, dout);
  };
  expect_gradient_matches("layernorm dx", x, accumulated_part(dx, kStart), loss);
  expect_gradient_matches("layernorm dw", w, accumulated_part(dw, kStart), loss);
  expect_gradient_matches("layernorm db", b, accumulated_part(db, kStart), loss);
}

TEST(Kernels, RmsNormForwardAndBackward) {
  const int N = 5, C = 12;
  const float eps = 1e-5f;
  auto x = random_vector(N * C, 8, 1.5f);
  auto w = random_vector(C, 9);
  std::vector<float> out(N * C), rstd(N);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
  std::vector<double> reference(N * C);
  for (int n = 0; n < N; n++) {
    double sum_squares = 0.0;
    for (int c = 0; c < C; c++) sum_squares += static_cast<double>(x[n * C + c]) * x[n * C + c];
    const double s = 1.0 / std::sqrt(sum_squares / C + eps);
    for (int c = 0; c < C; c++) reference[n * C + c] = x[n * C + c] * s * w[c];
  }
  EXPECT_LT(max_relative_difference(out.data(), reference.data(), out.size()), 1e-5);

  auto dout = random_vector(out.size(), 10);
  std::vector<float> dx(x.size(), kStart), dw(C, kStart);
  rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);
  auto loss = [&] {
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
    return weighted_sum(out, dout);
  };
  expect_gradient_matches("rmsnorm dx", x, accumulated_part(dx, kStart), loss);
  expect_gradient_matches("rmsnorm dw", w, accumulated_part(dw, kStart), loss);
}

TEST(Kernels, MatmulForwardAndBackward) {
  const int N = 7, C = 9, OC = 5;
  auto x = random_vector(N * C, 11);
  auto w = random_vector(OC * C, 12);
  auto b = random_vector(OC, 13);
  std::vector<float> out(N * OC);
  matmul_forward(out.data(), x.data(), w.data(), b.data(), N, C, OC);
  std::vector<double> reference(N * OC);
  for (int n = 0; n < N; n++) {
    for (int o = 0; o < OC; o++) {
      double sum = b[o];
      for (int c = 0; c < C; c++) sum += static_cast<double>(x[n * C + c]) * w[o * C + c];
      reference[n * OC + o] = sum;
    }
  }
  EXPECT_LT(max_relative_difference(out.data(), reference.data(), out.size()), 1e-5);

  auto dout = random_vector(out.size(), 14);
  std::vector<float> dx(x.size(), kStart), dw(w.size(), kStart), db(OC, kStart);
  matmul_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), N, C, OC);
  auto loss = [&] {
    matmul_forward(out.data(), x.data(), w.data(), b.data(), N, C, OC);
    return weighted_sum(out, dout);
  };
  expect_gradient_matches("matmul dx", x, accumulated_part(dx, kStart), loss);
  expect_gradient_matches("matmul dw", w, accumulated_part(dw, kStart), loss);
  expect_gradient_matches("matmul db", b, accumulated_part(db, kStart), loss);
  // Any of the three gradients alone, or in row pieces, adds the same.
  std::vector<float> db_alone(OC, kStart), dw_pieces(w.size(), kStart), db_pieces(OC, kStart);
  matmul_backward(nullptr, nullptr, db_alone.data(), dout.data(), x.data(), w.data(), N, C, OC);
  EXPECT_EQ(db_alone, db);
  for (int begin = 0; begin < OC; begin += 2) {
    const int end = std::min(OC, begin + 2);
    matmul_backward_weight_rows(dw_pieces.data() + begin * C, db_pieces.data() + begin, dout.data(), x.data(), N, C,
                                OC, begin, end);
  }
  EXPECT_LT(max_relative_difference(dw_pieces.data(), std::vector<double>(dw.begin(), dw.end()).data(), dw.size()), 1e-6);
  EXPECT_LT(max_relative_difference(db_pieces.data(), std::vector<double>(db.begin(), db.end()).data(), db.size()), 1e-6);
}

TEST(Kernels, GeluForwardAndBackward) {
  const int n = 64;
  auto x = random_vector(n, 15, 2.0f);
  std::vector<float> out(n);
  gelu_forward(out.data(), x.data(), n);
  std::vector<double> reference(n);
  for (int i = 0; i < n; i++) {
    const double v = x[i];
    reference[i] =
        0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (v + 0.044715 * v * v * v)));
  }
  EXPECT_LT(max_relative_difference(out.data(), reference.data(), n), 1e-6);
  auto dout = random_vector(n, 16);
  std::vector<float> dx(n, kStart);
  gelu_backward(dx.data(), x.data(), dout.data(), n);
  auto loss = [&] {
    gelu_forward(out.data(), x.data(), n);
    return weighted_sum(out, dout);
  };
  expect_gradient_matches("gelu dx", x, accumulated_part(dx, kStart), loss, 1e-2, 2e-3, n);
}

TEST(Kernels, SwigluForwardAndBackward) {
  const int N = 4, F = 6;
  auto x = random_vector(N * 2 * F, 17, 2.0f);
  std::vector<float> out(N * F);
  swiglu_forward(out.data(), x.data(), N, F);
  std::vector<double> reference(N * F);
  for (int n = 0; n < N; n++) {
    for (int f = 0; f < F; f++) {
      const double g = x[n * 2 * F + f];
      reference[n * F + f] = g / (1.0 + std::exp(-g)) * x[n * 2 * F + F + f];
    }
  }
  EXPECT_LT(max_relative_difference(out.data(), reference.data(), out.size()), 1e-6);
  auto dout = random_vector(out.size(), 18);
  std::vector<float> dx(x.size(), kStart);
  swiglu_backward(dx.data(), x.data(), dout.data(), N, F);
  auto loss = [&] {
    swiglu_forward(out.data(), x.data(), N, F);
    return weighted_sum(out, dout);
  };
  expect_gradient_matches("swiglu dx", x, accumulated_part(dx, kStart), loss, 1e-2, 2e-3,
                          x.size());
}

TEST(Kernels, ResidualForwardAndBackward) {
  const int n = 10;
  auto a = random_vector(n, 19);
  auto b = random_vector(n, 20);
  std::vector<float> out(n);
  residual_forward(out.data(), a.data(), b.data(), n);
  for (int i = 0; i < n; i++) EXPECT_FLOAT_EQ(out[i], a[i] + b[i]);
  auto dout = random_vector(n, 21);
  std::vector<float> da(n, kStart), db(n, kStart);
  residual_backward(da.data(), db.data(), dout.data(), n);
  auto loss = [&] {
    residual_forward(out.data(), a.data(), b.data(), n);
    return weighted_sum(out, dout);
  };
  expect_gradient_matches("residual da", a, accumulated_part(da, kStart), loss);
  expect_gradient_matches("residual db", b, accumulated_part(db, kStart), loss);
}

TEST(Kernels, CrossEntropyForwardAndBackward) {
  const int N = 5, V = 11;
  auto logits = random_vector(N * V, 22, 3.0f);
  std::vector<int32_t> targets = {0, 10, 3, 3, 7};
  std::vector<float> losses(N), lse(N);
  const float mean_loss =
      crossentropy_forward(losses.data(), lse.data(), logits.data(), targets.data(), N, V);
  double reference = 0.0;
  for (int n = 0; n < N; n++) {
    double sum = 0.0;
    for (int v = 0; v < V; v++) sum += std::exp(static_cast<double>(logits[n * V + v]));
    reference += std::log(sum) - logits[n * V + targets[n]];
  }
  reference /= N;
  EXPECT_NEAR(mean_loss, reference, 1e-5 * std::fabs(reference));

  std::vector<float> dlogits(logits);
  crossentropy_backward_inplace(dlogits.data(), lse.data(), targets.data(), N, V, 1.0f / N);
  auto loss = [&] {
    return static_cast<double>(
        crossentropy_forward(losses.data(), lse.data(), logits.data(), targets.data(), N, V));
  };
  expect_gradient_matches("crossentropy dlogits", logits, dlogits, loss, 1e-2, 2e-3,
                          logits.size());
}

TEST(Kernels, GemmPeakMeasurementAndKernelTimers) {
  runtime_set_threads(1);
  const double flops = profile_gemm_flops(128, 2);
  EXPECT_GT(flops, 1e8);  // any CPU of this decade does 0.1 GFLOP/s in fp32
  EXPECT_LT(flops, 1e13);
  profile_reset();
  profile_enable(true);
  EXPECT_TRUE(profile_enabled());
  std::vector<float> x(64 * 8, 1.0f), w(8 * 8, 1.0f), out(64 * 8);
  matmul_forward(out.data(), x.data(), w.data(), nullptr, 64, 8, 8);
  profile_enable(false);
  matmul_forward(out.data(), x.data(), w.data(), nullptr, 64, 8, 8);  // not counted
  const KernelProfile& profile = profile_read();
  EXPECT_EQ(profile.calls[static_cast<size_t>(KernelKind::KernelKind_matmul)], 1);
  EXPECT_EQ(profile.calls[static_cast<size_t>(KernelKind::KernelKind_norm)], 0);
  EXPECT_GE(profile.seconds[static_cast<size_t>(KernelKind::KernelKind_matmul)], 0.0);
  EXPECT_DOUBLE_EQ(profile.total_seconds(),
                   profile.seconds[static_cast<size_t>(KernelKind::KernelKind_matmul)]);
  EXPECT_DOUBLE_EQ(profile.total_cpu_seconds(),
                   profile.cpu_seconds[static_cast<size_t>(KernelKind::KernelKind_matmul)]);
}

// A tensor-parallel rank's slice of the vocabulary: the slices' maxima and exp sums, combined as
// the tensor-parallel max and sum combine them, give the whole vocabulary's losses, and each
// slice's dlogits are the whole's columns.
TEST(Kernels, CrossEntropyOverVocabularySlicesMatchesTheWhole) {
  const int N = 6, V = 13, first = 5;  // slices [0, 5) and [5, 13)
  auto logits = random_vector(N * V, 23, 3.0f);
  std::vector<int32_t> targets = {0, 12, 4, 5, 9, 2};
  std::vector<float> losses(N), lse(N);
  crossentropy_forward(losses.data(), lse.data(), logits.data(), targets.data(), N, V);
  std::vector<float> whole_dlogits(logits);
  crossentropy_backward_inplace(whole_dlogits.data(), lse.data(), targets.data(), N, V, 0.25f);

  const int widths[2] = {first, V - first};
  std::vector<float> slices[2], maxima[2], sums[2], target_logits[2];
  for (int s = 0; s < 2; s++) {
    for (int n = 0; n < N; n++)
      for (int v = 0; v < widths[s]; v++) slices[s].push_back(logits[n * V + s * first + v]);
    maxima[s].resize(N);
    crossentropy_slice_maxima(maxima[s].data(), slices[s].data(), N, widths[s]);
  }
  std::vector<float> max_all(N);
  for (int n = 0; n < N; n++) max_all[n] = std::max(maxima[0][n], maxima[1][n]);
  for (int s = 0; s < 2; s++) {
    sums[s].resize(N);
    target_logits[s].resize(N);
    crossentropy_slice_sums(sums[s].data(), target_logits[s].data(), slices[s].data(), max_all.data(), targets.data(),
                            s * first, N, widths[s]);
  }
  std::vector<float> slice_lse(N);
  for (int n = 0; n < N; n++) {
    slice_lse[n] = max_all[n] + std::log(sums[0][n] + sums[1][n]);
    EXPECT_NEAR(slice_lse[n], lse[n], 1e-5f * std::fabs(lse[n])) << "row " << n;
    EXPECT_NEAR(slice_lse[n] - (target_logits[0][n] + target_logits[1][n]), losses[n], 1e-5f) << "row " << n;
  }
  for (int s = 0; s < 2; s++) {
    crossentropy_slice_backward_inplace(slices[s].data(), slice_lse.data(), targets.data(), s * first, N, widths[s], 0.25f);
    for (int n = 0; n < N; n++)
      for (int v = 0; v < widths[s]; v++)
        EXPECT_NEAR(slices[s][n * widths[s] + v], whole_dlogits[n * V + s * first + v], 1e-6f) << n << ", " << v;
  }
}

// matmul_backward times its weight-gradient GEMM through matmul_backward_weight_rows, which has a
// timer of its own: the kinds' times must add up to the kernels' time, not count that GEMM twice.
TEST(Kernels, NestedKernelTimersCountOnce) {
  runtime_set_threads(1);
  const int N = 256, C = 256, OC = 512;
  std::vector<float> dout(static_cast<size_t>(N) * OC, 0.01f), inp(static_cast<size_t>(N) * C, 0.02f),
      w(static_cast<size_t>(OC) * C, 0.03f), dinp(inp.size()), dw(w.size()), db(OC);
  matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C, OC);  // warm-up
  profile_reset();
  profile_enable(true);
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < 4; ++r)
    matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C, OC);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  profile_enable(false);
  const KernelProfile& profile = profile_read();
  EXPECT_EQ(profile.calls[static_cast<size_t>(KernelKind::KernelKind_matmul)], 4);
  EXPECT_LE(profile.total_seconds(), wall);
  EXPECT_GT(profile.total_seconds(), 0.5 * wall);  // the GEMMs are the loop's work
}

TEST(Kernels, ThreadSettingIsHonoured) {
  runtime_set_threads(1);
  EXPECT_EQ(runtime_threads(), 1);
  runtime_set_threads(2);
  EXPECT_EQ(runtime_threads(), 2);
  runtime_set_threads(0);
  EXPECT_EQ(runtime_threads(), runtime_default_threads());
  EXPECT_GE(runtime_default_threads(), 1);
}

}  // namespace
}  // namespace alloy
