// The CUDA kernels of runtime/cuda/kernels.hpp against their CPU kernels on random data: the CPU
// gets the bf16-rounded inputs, so only the GPU's arithmetic and its bf16 outputs differ. Sizes
// cover the packed and scalar paths (C % 8, unaligned pointers, tails of n % 8), a single row,
// rows looped over by the persistent grids, and accumulate-versus-overwrite semantics.
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"
#include "runtime/cpu/activation.hpp"
#include "runtime/cpu/attention.hpp"
#include "runtime/cpu/embedding.hpp"
#include "runtime/cpu/loss.hpp"
#include "runtime/cpu/matmul.hpp"
#include "runtime/cpu/norm.hpp"
#include "runtime/cpu/optimizer.hpp"
#include "runtime/cuda/kernels.hpp"

namespace alloy::testing {

namespace kernels_test {

// bf16 outputs: one bf16 rounding (relative 2^-9) on top of fp32 differences.
constexpr double kBf16Atol = 1e-2;
constexpr double kBf16Rtol = 2e-2;

// Expects |gpu - cpu| <= atol + rtol |cpu| everywhere; on failure names the worst element.
void expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu, double atol, double rtol,
                  const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  double worst = 0.0;
  size_t worst_index = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    const double ratio = std::fabs(double{gpu[i]} - double{cpu[i]}) / (atol + rtol * std::fabs(double{cpu[i]}));
    if (!(ratio <= worst)) {  // NaN counts as the worst
      worst = std::isnan(ratio) ? INFINITY : ratio;
      worst_index = i;
    }
  }
  EXPECT_LE(worst, 1.0) << what << ": worst element " << worst_index << " gpu " << gpu[worst_index] << " cpu "
                        << cpu[worst_index] << " (error / tolerance = " << worst << ")";
}

// Expects the two to be equal element for element; on failure names the first difference.
void expect_equal(const std::vector<float>& gpu, const std::vector<float>& expected, const std::string& what) {
  ASSERT_EQ(gpu.size(), expected.size()) << what;
  for (size_t i = 0; i < gpu.size(); ++i) {
    ASSERT_EQ(gpu[i], expected[i]) << what << ": first difference at element " << i;
  }
}

void expect_close_bf16(const DeviceBuffer<bf16>& gpu, const std::vector<float>& cpu, const std::string& what) {
  expect_close(to_float(gpu.download()), cpu, kBf16Atol, kBf16Rtol, what);
}

// Random values that bf16 represents exactly, so CPU and GPU start from the same numbers.
std::vector<float> random_bf16_values(int64_t n, float scale, uint64_t seed, float offset = 0.0f) {
  std::vector<float> x = random_floats(n, scale, seed);
  for (float& v : x) v += offset;
  return round_bf16(x);
}

template <typename T>
void upload_at(T* device, const std::vector<T>& host) {
  cuda_check(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "test upload");
}

template <typename T>
std::vector<T> download_from(const T* device, int64_t n) {
  std::vector<T> host(static_cast<size_t>(n));
  cuda_check(cudaDeviceSynchronize(), "test kernels");
  cuda_check(cudaMemcpy(host.data(), device, host.size() * sizeof(T), cudaMemcpyDeviceToHost), "test download");
  return host;
}

std::vector<int32_t> random_ids(int64_t n, int32_t below, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> pick(0, below - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) id = pick(rng);
  return ids;
}

struct NormCase {
  int N;
  int C;
  bool bias;  // LayerNorm: with a bias (forward) / with db (backward)
};

// Packed rows (C % 8 == 0), the largest C, a single scalar row, scalar rows without bias, and
// more 32-row tiles than the backward's persistent grid holds at once (at most 8 blocks of 256
// threads per SM, 132 SMs on an H200: 33792 rows), so its blocks loop over several tiles.
const std::vector<NormCase> kNormCases = {
    {37, 768, true}, {5, 8192, true}, {1, 100, true}, {3, 50, false}, {40000, 24, true}};

std::string norm_case_name(const NormCase& c) {
  return "N=" + std::to_string(c.N) + " C=" + std::to_string(c.C) + (c.bias ? " bias" : " no bias");
}

// Sums of N terms of order 1: fp32 rounding grows like N eps, kept well inside this.
double weight_grad_atol(int N) { return 1e-4 * std::sqrt(static_cast<double>(N)); }

TEST(CudaKernels, LayerNormForwardMatchesCpu) {
  ALLOY_REQUIRE_GPU();
  for (const NormCase& c : kNormCases) {
    SCOPED_TRACE(norm_case_name(c));
    const int64_t NC = int64_t{c.N} * c.C;
    const std::vector<float> inp = random_bf16_values(NC, 1.0f, 1, 0.5f);
    const std::vector<float> w = random_bf16_values(c.C, 1.0f, 2, 1.0f);
    const std::vector<float> b = random_bf16_values(c.C, 0.5f, 3);
    std::vector<float> out(NC), mean(c.N), rstd(c.N);
    layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), c.bias ? b.data() : nullptr, c.N, c.C,
                      1e-5f);

    DeviceBuffer<bf16> d_inp(to_bf16(inp)), d_w(to_bf16(w)), d_b(to_bf16(b)), d_out(NC);
    DeviceBuffer<float> d_mean(c.N), d_rstd(c.N);
    cuda_layernorm_forward(d_out.get(), d_mean.get(), d_rstd.get(), d_inp.get(), d_w.get(),
                           c.bias ? d_b.get() : nullptr, c.N, c.C, 1e-5f, nullptr);
    expect_close_bf16(d_out, out, "out");
    expect_close(d_mean.download(), mean, 1e-5, 1e-4, "mean");
    expect_close(d_rstd.download(), rstd, 1e-5, 1e-4, "rstd");
  }
}

TEST(CudaKernels, LayerNormBackwardAccumulatesLikeCpu) {
  ALLOY_REQUIRE_GPU();
  for (const NormCase& c : kNormCases) {
    SCOPED_TRACE(norm_case_name(c));
    const int64_t NC = int64_t{c.N} * c.C;
    const std::vector<float> inp = random_bf16_values(NC, 1.0f, 4, 0.5f);
    const std::vector<float> w = random_bf16_values(c.C, 1.0f, 5, 1.0f);
    const std::vector<float> dout = random_bf16_values(NC, 1.0f, 6);
    std::vector<float> out(NC), mean(c.N), rstd(c.N);
    layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), nullptr, c.N, c.C, 1e-5f);
    // Nonzero starting gradients: the kernels add to them.
    std::vector<float> dinp = random_bf16_values(NC, 1.0f, 7);
    std::vector<float> dw = random_floats(c.C, 1.0f, 8);
    std::vector<float> db = random_floats(c.C, 1.0f, 9);
    DeviceBuffer<bf16> d_inp(to_bf16(inp)), d_w(to_bf16(w)), d_dout(to_bf16(dout)), d_dinp(to_bf16(dinp));
    DeviceBuffer<float> d_mean(mean), d_rstd(rstd), d_dw(dw), d_db(db);
    layernorm_backward(dinp.data(), dw.data(), c.bias ? db.data() : nullptr, dout.data(), inp.data(), w.data(),
                       mean.data(), rstd.data(), c.N, c.C);
    cuda_layernorm_backward(d_dinp.get(), d_dw.get(), c.bias ? d_db.get() : nullptr, d_dout.get(), d_inp.get(),
                            d_w.get(), d_mean.get(), d_rstd.get(), c.N, c.C, nullptr);
    expect_close_bf16(d_dinp, dinp, "dinp");
    expect_close(d_dw.download(), dw, weight_grad_atol(c.N), 1e-4, "dw");
    // Without db the GPU must leave it alone, as the CPU did.
    expect_close(d_db.download(), db, weight_grad_atol(c.N), 1e-4, "db");
  }
}

TEST(CudaKernels, RmsNormForwardMatchesCpu) {
  ALLOY_REQUIRE_GPU();
  for (const NormCase& c : kNormCases) {
    SCOPED_TRACE(norm_case_name(c));
    const int64_t NC = int64_t{c.N} * c.C;
    const std::vector<float> inp = random_bf16_values(NC, 1.0f, 11, 0.5f);
    const std::vector<float> w = random_bf16_values(c.C, 1.0f, 12, 1.0f);
    std::vector<float> out(NC), rstd(c.N);
    rmsnorm_forward(out.data(), rstd.data(), inp.data(), w.data(), c.N, c.C, 1e-6f);

    DeviceBuffer<bf16> d_inp(to_bf16(inp)), d_w(to_bf16(w)), d_out(NC);
    DeviceBuffer<float> d_rstd(c.N);
    cuda_rmsnorm_forward(d_out.get(), d_rstd.get(), d_inp.get(), d_w.get(), c.N, c.C, 1e-6f, nullptr);
    expect_close_bf16(d_out, out, "out");
    expect_close(d_rstd.download(), rstd, 1e-5, 1e-4, "rstd");
  }
}

TEST(CudaKernels, RmsNormBackwardAccumulatesLikeCpu) {
  ALLOY_REQUIRE_GPU();
  for (const NormCase& c : kNormCases) {
    SCOPED_TRACE(norm_case_name(c));
    const int64_t NC = int64_t{c.N} * c.C;
    const std::vector<float> inp = random_bf16_values(NC, 1.0f, 13, 0.5f);
    const std::vector<float> w = random_bf16_values(c.C, 1.0f, 14, 1.0f);
    const std::vector<float> dout = random_bf16_values(NC, 1.0f, 15);
    std::vector<float> out(NC), rstd(c.N);
    rmsnorm_forward(out.data(), rstd.data(), inp.data(), w.data(), c.N, c.C, 1e-6f);
    std::vector<float> dinp = random_bf16_values(NC, 1.0f, 16);
    std::vector<float> dw = random_floats(c.C, 1.0f, 17);
    DeviceBuffer<bf16> d_inp(to_bf16(inp)), d_w(to_bf16(w)), d_dout(to_bf16(dout)), d_dinp(to_bf16(dinp));
    DeviceBuffer<float> d_rstd(rstd), d_dw(dw);
    rmsnorm_backward(dinp.data(), dw.data(), dout.data(), inp.data(), w.data(), rstd.data(), c.N, c.C);
    cuda_rmsnorm_backward(d_dinp.get(), d_dw.get(), d_dout.get(), d_inp.get(), d_w.get(), d_rstd.get(), c.N, c.C,
                          nullptr);
    expect_close_bf16(d_dinp, dinp, "dinp");
    expect_close(d_dw.download(), dw, weight_grad_atol(c.N), 1e-4, "dw");
  }
}

// offset 0: packed head plus a scalar tail of n % 8; offset 1: every pointer misaligned, all
// scalar.
TEST(CudaKernels, GeluForwardAndBackwardMatchCpu) {
  ALLOY_REQUIRE_GPU();
  for (const int offset : {0, 1}) {
    SCOPED_TRACE("offset " + std::to_string(offset));
    const int64_t n = 100003;
    const std::vector<float> inp = random_bf16_values(n, 2.0f, 21);
    const std::vector<float> dout = random_bf16_values(n, 1.0f, 22);
    std::vector<float> out(n), dinp(n, 0.0f);
    gelu_forward(out.data(), inp.data(), n);
    gelu_backward(dinp.data(), inp.data(), dout.data(), n);

    DeviceBuffer<bf16> d_inp(n + offset), d_dout(n + offset), d_out(n + offset), d_dinp(n + offset);
    upload_at(d_inp.get() + offset, to_bf16(inp));
    upload_at(d_dout.get() + offset, to_bf16(dout));
    upload_at(d_dinp.get() + offset, to_bf16(std::vector<float>(n, 7.0f)));  // overwritten, not added to
    cuda_gelu_forward(d_out.get() + offset, d_inp.get() + offset, n, nullptr);
    cuda_gelu_backward(d_dinp.get() + offset, d_inp.get() + offset, d_dout.get() + offset, n, nullptr);
    expect_close(to_float(download_from(d_out.get() + offset, n)), out, kBf16Atol, kBf16Rtol, "out");
    expect_close(to_float(download_from(d_dinp.get() + offset, n)), dinp, kBf16Atol, kBf16Rtol, "dinp");

    // In place: dinp is dout.
    cuda_gelu_backward(d_dout.get() + offset, d_inp.get() + offset, d_dout.get() + offset, n, nullptr);
    expect_close(to_float(download_from(d_dout.get() + offset, n)), dinp, kBf16Atol, kBf16Rtol, "dinp in place");
  }
}

TEST(CudaKernels, SwigluForwardAndBackwardMatchCpu) {
  ALLOY_REQUIRE_GPU();
  struct Case {
    int64_t N;
    int F;
  };
  for (const Case c : {Case{33, 136}, Case{1, 37}, Case{70, 8}}) {
    SCOPED_TRACE("N=" + std::to_string(c.N) + " F=" + std::to_string(c.F));
    const std::vector<float> inp = random_bf16_values(c.N * 2 * c.F, 2.0f, 31);
    const std::vector<float> dout = random_bf16_values(c.N * c.F, 1.0f, 32);
    std::vector<float> out(c.N * c.F), dinp(c.N * 2 * c.F, 0.0f);
    swiglu_forward(out.data(), inp.data(), c.N, c.F);
    swiglu_backward(dinp.data(), inp.data(), dout.data(), c.N, c.F);

    DeviceBuffer<bf16> d_inp(to_bf16(inp)), d_dout(to_bf16(dout)), d_out(c.N * c.F);
    DeviceBuffer<bf16> d_dinp(to_bf16(std::vector<float>(c.N * 2 * c.F, -3.0f)));  // overwritten
    cuda_swiglu_forward(d_out.get(), d_inp.get(), c.N, c.F, nullptr);
    cuda_swiglu_backward(d_dinp.get(), d_inp.get(), d_dout.get(), c.N, c.F, nullptr);
    expect_close_bf16(d_out, out, "out");
    expect_close_bf16(d_dinp, dinp, "dinp");
  }
}

TEST(CudaKernels, ResidualForwardAddsAndMayAlias) {
  ALLOY_REQUIRE_GPU();
  const int64_t n = 1001;
  const std::vector<float> a = random_bf16_values(n, 1.0f, 41);
  const std::vector<float> b = random_bf16_values(n, 1.0f, 42);
  std::vector<float> out(n);
  residual_forward(out.data(), a.data(), b.data(), n);
  DeviceBuffer<bf16> d_a(to_bf16(a)), d_b(to_bf16(b)), d_out(n);
  cuda_residual_forward(d_out.get(), d_a.get(), d_b.get(), n, nullptr);
  expect_close_bf16(d_out, out, "out");
  cuda_residual_forward(d_a.get(), d_a.get(), d_b.get(), n, nullptr);
  expect_close_bf16(d_a, out, "out aliasing a");
}

TEST(CudaKernels, RopeForwardAndBackwardMatchCpuAndLeaveValuesAlone) {
  ALLOY_REQUIRE_GPU();
  struct Case {
    int B, T, Hq, Hkv, D;
  };
  for (const Case c : {Case{2, 17, 4, 2, 64}, Case{1, 5, 3, 3, 6}, Case{3, 40, 2, 1, 128}}) {
    SCOPED_TRACE("B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) + " D=" + std::to_string(c.D));
    const int64_t R = int64_t{c.Hq + 2 * c.Hkv} * c.D;
    const int64_t n = int64_t{c.B} * c.T * R;
    const std::vector<float> qkv = random_bf16_values(n, 1.0f, 51);
    for (const bool forward : {true, false}) {
      std::vector<float> expected = qkv;
      DeviceBuffer<bf16> d_qkv(to_bf16(qkv));
      if (forward) {
        rope_forward(expected.data(), c.B, c.T, c.Hq, c.Hkv, c.D, rope_inverse_frequencies(c.D, 10000.0).data());
        cuda_rope_forward(d_qkv.get(), c.B, c.T, c.Hq, c.Hkv, c.D, 10000.0f, nullptr);
      } else {
        rope_backward(expected.data(), c.B, c.T, c.Hq, c.Hkv, c.D, rope_inverse_frequencies(c.D, 10000.0).data());
        cuda_rope_backward(d_qkv.get(), c.B, c.T, c.Hq, c.Hkv, c.D, 10000.0f, nullptr);
      }
      const std::vector<float> got = to_float(d_qkv.download());
      expect_close(got, expected, kBf16Atol, kBf16Rtol, forward ? "rope forward" : "rope backward");
      // The value heads come through bit for bit.
      for (int64_t bt = 0; bt < int64_t{c.B} * c.T; ++bt) {
        for (int64_t k = int64_t{c.Hq + c.Hkv} * c.D; k < R; ++k) {
          ASSERT_EQ(got[bt * R + k], qkv[bt * R + k]) << "value element " << k << " of row " << bt;
        }
      }
    }
  }
}

TEST(CudaKernels, BiasBackwardAccumulatesColumnSums) {
  ALLOY_REQUIRE_GPU();
  struct Case {
    int N, M;
  };
  // Packed tiles, a single scalar row, columns not filling a tile, and more rows than the grid.
  for (const Case c : {Case{1000, 768}, Case{1, 37}, Case{17, 264}, Case{20000, 24}, Case{5, 13}}) {
    SCOPED_TRACE("N=" + std::to_string(c.N) + " M=" + std::to_string(c.M));
    const std::vector<float> dout = random_bf16_values(int64_t{c.N} * c.M, 1.0f, 61);
    std::vector<float> db = random_floats(c.M, 1.0f, 62);
    // matmul_backward's db is the CPU's bias gradient; with C = 1 its other outputs are cheap.
    std::vector<float> inp(c.N, 0.0f), w(c.M, 0.0f), dw(c.M, 0.0f);
    DeviceBuffer<bf16> d_dout(to_bf16(dout));
    DeviceBuffer<float> d_db(db);
    matmul_backward(nullptr, dw.data(), db.data(), dout.data(), inp.data(), w.data(), c.N, 1, c.M);
    cuda_bias_backward(d_db.get(), d_dout.get(), c.N, c.M, nullptr);
    expect_close(d_db.download(), db, weight_grad_atol(c.N), 1e-5, "db");
  }
}

TEST(CudaKernels, EmbeddingForwardMatchesCpu) {
  ALLOY_REQUIRE_GPU();
  struct Case {
    int B, T, C, V;
    bool positions;
  };
  for (const Case c : {Case{3, 5, 64, 11, true}, Case{2, 7, 20, 5, false}, Case{1, 1, 8, 3, true}}) {
    SCOPED_TRACE("C=" + std::to_string(c.C) + (c.positions ? " with wpe" : " without wpe"));
    const std::vector<int32_t> tokens = random_ids(int64_t{c.B} * c.T, c.V, 71);
    const std::vector<float> wte = random_bf16_values(int64_t{c.V} * c.C, 1.0f, 72);
    const std::vector<float> wpe = random_bf16_values(int64_t{c.T} * c.C, 1.0f, 73);
    std::vector<float> out(int64_t{c.B} * c.T * c.C);
    embedding_forward(out.data(), tokens.data(), wte.data(), c.positions ? wpe.data() : nullptr, c.B, c.T, c.C);
    DeviceBuffer<int32_t> d_tokens(tokens);
    DeviceBuffer<bf16> d_wte(to_bf16(wte)), d_wpe(to_bf16(wpe)), d_out(int64_t{c.B} * c.T * c.C);
    cuda_embedding_forward(d_out.get(), d_tokens.get(), d_wte.get(), c.positions ? d_wpe.get() : nullptr, c.B, c.T, c.C,
                           nullptr);
    expect_close_bf16(d_out, out, "out");
  }
}

TEST(CudaKernels, EmbeddingBackwardAccumulatesRepeatedTokens) {
  ALLOY_REQUIRE_GPU();
  struct Case {
    int B, T, C, V;
    bool positions;
  };
  for (const Case c : {Case{4, 7, 64, 5, true}, Case{3, 9, 33, 2, false}, Case{1, 300, 8, 4, true}}) {
    SCOPED_TRACE("C=" + std::to_string(c.C) + (c.positions ? " with dwpe" : " without dwpe"));
    const std::vector<int32_t> tokens = random_ids(int64_t{c.B} * c.T, c.V, 81);
    const std::vector<float> dout = random_bf16_values(int64_t{c.B} * c.T * c.C, 1.0f, 82);
    std::vector<float> dwte = random_floats(int64_t{c.V} * c.C, 1.0f, 83);
    std::vector<float> dwpe = random_floats(int64_t{c.T} * c.C, 1.0f, 84);
    DeviceBuffer<int32_t> d_tokens(tokens);
    DeviceBuffer<bf16> d_dout(to_bf16(dout));
    DeviceBuffer<float> d_dwte(dwte), d_dwpe(dwpe);
    embedding_backward(dwte.data(), c.positions ? dwpe.data() : nullptr, dout.data(), tokens.data(), c.B, c.T, c.C);
    cuda_embedding_backward(d_dwte.get(), c.positions ? d_dwpe.get() : nullptr, d_dout.get(), d_tokens.get(), c.B, c.T,
                            c.C, nullptr);
    expect_close(d_dwte.download(), dwte, 1e-4, 1e-5, "dwte");
    expect_close(d_dwpe.download(), dwpe, 1e-4, 1e-5, "dwpe");
  }
}

struct LossCase {
  int N, V, ld;
  int offset;  // elements the logits start after an aligned address (1: the scalar path)
};

TEST(CudaKernels, CrossEntropyMatchesCpuAndZeroesPadding) {
  ALLOY_REQUIRE_GPU();
  for (const LossCase c : {LossCase{5, 1000, 1008, 0}, LossCase{3, 50257, 50304, 0}, LossCase{1, 8, 8, 0},
                           LossCase{4, 37, 40, 0}, LossCase{4, 37, 40, 1}}) {
    SCOPED_TRACE("N=" + std::to_string(c.N) + " V=" + std::to_string(c.V) + " ld=" + std::to_string(c.ld) +
                 " offset=" + std::to_string(c.offset));
    // Padding columns hold a large logit: counted in by mistake, it would dominate the loss.
    std::vector<float> padded(int64_t{c.N} * c.ld, 50.0f);
    const std::vector<float> logits = random_bf16_values(int64_t{c.N} * c.V, 3.0f, 91);
    for (int n = 0; n < c.N; ++n) {
      for (int v = 0; v < c.V; ++v) padded[int64_t{n} * c.ld + v] = logits[int64_t{n} * c.V + v];
    }
    std::vector<int32_t> targets = random_ids(c.N, c.V, 92);
    targets[0] = c.V - 1;  // the last vocabulary column, next to the padding
    const float dloss = 1.0f / static_cast<float>(c.N);
    std::vector<float> losses(c.N), lse(c.N), dlogits = logits;
    crossentropy_forward(losses.data(), lse.data(), logits.data(), targets.data(), c.N, c.V);
    crossentropy_backward_inplace(dlogits.data(), lse.data(), targets.data(), c.N, c.V, dloss);

    const int64_t n_padded = int64_t{c.N} * c.ld;
    DeviceBuffer<bf16> d_logits(n_padded + c.offset);
    DeviceBuffer<int32_t> d_targets(targets);
    DeviceBuffer<float> d_losses(c.N);
    bf16* logits_at = d_logits.get() + c.offset;
    upload_at(logits_at, to_bf16(padded));

    cuda_crossentropy(logits_at, d_losses.get(), d_targets.get(), c.N, c.V, c.ld, dloss, false, nullptr);
    expect_close(d_losses.download(), losses, 1e-4, 1e-4, "losses (forward only)");
    expect_equal(to_float(download_from(logits_at, n_padded)), padded, "logits after a forward-only call");

    cuda_crossentropy(logits_at, d_losses.get(), d_targets.get(), c.N, c.V, c.ld, dloss, true, nullptr);
    expect_close(d_losses.download(), losses, 1e-4, 1e-4, "losses (with backward)");
    const std::vector<float> got = to_float(download_from(logits_at, n_padded));
    std::vector<float> got_vocabulary(int64_t{c.N} * c.V);
    for (int n = 0; n < c.N; ++n) {
      for (int v = 0; v < c.ld; ++v) {
        const float g = got[int64_t{n} * c.ld + v];
        if (v < c.V) {
          got_vocabulary[int64_t{n} * c.V + v] = g;
        } else {
          ASSERT_EQ(g, 0.0f) << "padding column " << v << " of row " << n;
        }
      }
    }
    expect_close(got_vocabulary, dlogits, 1e-6 * dloss, kBf16Rtol, "dlogits");
  }
}

TEST(CudaKernels, AdamWMatchesCpuOverTwoSteps) {
  ALLOY_REQUIRE_GPU();
  for (const int offset : {0, 1}) {
    SCOPED_TRACE("offset " + std::to_string(offset));
    const int64_t n = 10003;
    AdamWHyper hyper;
    hyper.learning_rate = 1e-3f;
    hyper.beta1 = 0.9f;
    hyper.beta2 = 0.95f;
    hyper.eps = 1e-8f;
    hyper.weight_decay = 0.1f;
    hyper.grad_scale = 0.7f;
    std::vector<float> params = random_floats(n, 0.02f, 101);
    std::vector<float> m(n, 0.0f), v(n, 0.0f);
    DeviceBuffer<float> d_params(n + offset), d_grads(n + offset), d_m(n + offset), d_v(n + offset);
    DeviceBuffer<bf16> d_params_bf16(n + offset);
    upload_at(d_params.get() + offset, params);
    upload_at(d_m.get() + offset, m);
    upload_at(d_v.get() + offset, v);
    for (int64_t step = 1; step <= 2; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      const std::vector<float> grads = random_floats(n, 0.01f, 102 + static_cast<uint64_t>(step));
      upload_at(d_grads.get() + offset, grads);
      adamw_update(params.data(), m.data(), v.data(), grads.data(), n, hyper, step);
      cuda_adamw_update(d_params.get() + offset, d_params_bf16.get() + offset, d_grads.get() + offset,
                        d_m.get() + offset, d_v.get() + offset, n, hyper.learning_rate, hyper.beta1, hyper.beta2,
                        hyper.eps, hyper.weight_decay, hyper.grad_scale, step, nullptr);
      const std::vector<float> got = download_from(d_params.get() + offset, n);
      expect_close(got, params, 1e-7, 1e-5, "params");
      expect_close(download_from(d_m.get() + offset, n), m, 1e-9, 1e-5, "m");
      expect_close(download_from(d_v.get() + offset, n), v, 1e-12, 1e-5, "v");
      expect_equal(to_float(download_from(d_params_bf16.get() + offset, n)), round_bf16(got),
                   "params_bf16 against the updated fp32 params rounded");
    }
  }
}

TEST(CudaKernels, SumSquaresAddsToTheTotal) {
  ALLOY_REQUIRE_GPU();
  for (const int offset : {0, 1}) {
    for (const int64_t n : {int64_t{1} << 20 | 5, int64_t{1001}, int64_t{1}}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " offset " + std::to_string(offset));
      const std::vector<float> x = random_floats(n, 0.5f, 111);
      DeviceBuffer<float> d_x(n + offset);
      upload_at(d_x.get() + offset, x);
      DeviceBuffer<float> d_sum(std::vector<float>{2.5f});
      cuda_sum_squares(d_sum.get(), d_x.get() + offset, n, nullptr);
      const double norm = grad_norm(x.data(), n);
      expect_close(d_sum.download(), {static_cast<float>(2.5 + norm * norm)}, 0.0, 3e-5, "sum");
    }
  }
}

TEST(CudaKernels, SumAddsToTheTotalInDouble) {
  ALLOY_REQUIRE_GPU();
  for (const int64_t n : {int64_t{1} << 20 | 5, int64_t{1001}, int64_t{1}}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const std::vector<float> x = random_floats(n, 3.0f, 131);
    DeviceBuffer<float> d_x(x);
    // A total far above the addends: an fp32 total would lose their low bits.
    DeviceBuffer<double> d_sum(std::vector<double>{1e6});
    cuda_sum(d_sum.get(), d_x.get(), n, nullptr);
    double expected = 1e6;
    for (const float v : x) expected += v;
    EXPECT_NEAR(d_sum.download()[0], expected, 1e-2);
  }
}

TEST(CudaKernels, ConversionsRoundToNearestEven) {
  ALLOY_REQUIRE_GPU();
  for (const int offset : {0, 1}) {
    SCOPED_TRACE("offset " + std::to_string(offset));
    const int64_t n = 1003;
    const std::vector<float> x = random_floats(n, 100.0f, 121);
    DeviceBuffer<float> d_x(n + offset), d_back(n + offset);
    DeviceBuffer<bf16> d_h(n + offset);
    upload_at(d_x.get() + offset, x);
    cuda_float_to_bf16(d_h.get() + offset, d_x.get() + offset, n, nullptr);
    const std::vector<float> rounded = to_float(download_from(d_h.get() + offset, n));
    expect_equal(rounded, round_bf16(x), "float to bf16");
    cuda_bf16_to_float(d_back.get() + offset, d_h.get() + offset, n, nullptr);
    expect_equal(download_from(d_back.get() + offset, n), rounded, "bf16 to float");
  }
}

TEST(CudaKernels, EmptyInputsLaunchNothing) {
  ALLOY_REQUIRE_GPU();
  cuda_gelu_forward(nullptr, nullptr, 0, nullptr);
  cuda_layernorm_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 768, 1e-5f, nullptr);
  cuda_layernorm_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 768, nullptr);
  cuda_crossentropy(nullptr, nullptr, nullptr, 0, 10, 16, 1.0f, true, nullptr);
  cuda_adamw_update(nullptr, nullptr, nullptr, nullptr, nullptr, 0, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 1.0f, 1, nullptr);
  cuda_bias_backward(nullptr, nullptr, 0, 768, nullptr);
  cuda_sum(nullptr, nullptr, 0, nullptr);
  cuda_check(cudaDeviceSynchronize(), "empty launches");
}

}  // namespace kernels_test

}  // namespace alloy::testing
