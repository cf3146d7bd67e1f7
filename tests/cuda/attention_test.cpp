// Fused GPU attention (fast tensor-core kernels and the plain reference kernels) against the CPU
// attention on the same bf16-rounded inputs: outputs, log-sum-exps and all of dqkv, for head_dim
// 64 and 128, sequence lengths that are and are not multiples of the 64-row tiles, and both
// multi-head and grouped-query layouts; plus the shape and environment checks.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"
#include "runtime/cpu/attention.hpp"
#include "runtime/cuda/attention.hpp"
#include "runtime/cuda/attention_reference.hpp"
#include "spec/error.hpp"

namespace alloy::testing {
namespace {

struct AttentionCase {
  int B, T, Hq, Hkv, D;
  bool reference;  // the reference kernels instead of the fast ones
};

std::string case_name(const ::testing::TestParamInfo<AttentionCase>& info) {
  const AttentionCase& c = info.param;
  return std::string(c.reference ? "reference" : "fast") + "_B" + std::to_string(c.B) + "_T" + std::to_string(c.T) +
         "_Hq" + std::to_string(c.Hq) + "_Hkv" + std::to_string(c.Hkv) + "_D" + std::to_string(c.D);
}

// The CPU's results on the rounded inputs: out, lse (from the diagonal probability:
// p[t][t] = exp(s[t][t] - lse[t]), with s[t][t] in double) and dqkv.
struct CpuAttention {
  std::vector<float> out, lse, dqkv;
};

CpuAttention cpu_attention(const std::vector<float>& qkv, const std::vector<float>& dout, const AttentionCase& c) {
  const int64_t R = static_cast<int64_t>(c.Hq + 2 * c.Hkv) * c.D;
  CpuAttention cpu;
  cpu.out.assign(static_cast<size_t>(c.B) * c.T * c.Hq * c.D, 0.0f);
  cpu.lse.assign(static_cast<size_t>(c.B) * c.Hq * c.T, 0.0f);
  cpu.dqkv.assign(qkv.size(), 0.0f);
  std::vector<float> probs(static_cast<size_t>(c.B) * c.Hq * c.T * c.T);
  attention_forward(cpu.out.data(), probs.data(), qkv.data(), c.B, c.T, c.Hq, c.Hkv, c.D);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  for (int b = 0; b < c.B; ++b) {
    for (int h = 0; h < c.Hq; ++h) {
      const int kv_head = h / (c.Hq / c.Hkv);
      for (int t = 0; t < c.T; ++t) {
        const float* row = qkv.data() + (static_cast<int64_t>(b) * c.T + t) * R;
        double score = 0.0;
        for (int d = 0; d < c.D; ++d) score += double{row[h * c.D + d]} * row[(c.Hq + kv_head) * c.D + d];
        const double p = probs[((static_cast<size_t>(b) * c.Hq + h) * c.T + t) * c.T + t];
        cpu.lse[(static_cast<size_t>(b) * c.Hq + h) * c.T + t] = static_cast<float>(score * scale - std::log(p));
      }
    }
  }
  std::vector<float> scratch(static_cast<size_t>(attention_backward_scratch_floats(c.T)));
  attention_backward(cpu.dqkv.data(), scratch.data(), dout.data(), probs.data(), qkv.data(), c.B, c.T, c.Hq, c.Hkv,
                     c.D);
  return cpu;
}

class CudaAttentionTest : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(CudaAttentionTest, MatchesCpu) {
  ALLOY_REQUIRE_GPU();
  const AttentionCase c = GetParam();
  const int64_t R = static_cast<int64_t>(c.Hq + 2 * c.Hkv) * c.D;
  const int64_t rows = static_cast<int64_t>(c.B) * c.T;
  const std::vector<float> qkv = round_bf16(random_floats(rows * R, 1.0f, 11 + c.T + c.D));
  const std::vector<float> dout = round_bf16(random_floats(rows * c.Hq * c.D, 1.0f, 23 + c.T + c.Hq));
  const CpuAttention cpu = cpu_attention(qkv, dout, c);

  DeviceBuffer<bf16> qkv_gpu(to_bf16(qkv));
  DeviceBuffer<bf16> dout_gpu(to_bf16(dout));
  DeviceBuffer<bf16> out_gpu(rows * c.Hq * c.D);
  DeviceBuffer<float> lse_gpu(static_cast<int64_t>(c.B) * c.Hq * c.T);
  // Poisoned with NaN bits: every element of dqkv must be overwritten.
  DeviceBuffer<bf16> dqkv_gpu(std::vector<bf16>(static_cast<size_t>(rows * R), __float2bfloat16(NAN)));
  const int64_t workspace_bytes = c.reference
                                      ? cuda_attention_reference_backward_workspace_bytes(c.B, c.T, c.Hq, c.Hkv, c.D)
                                      : cuda_attention_backward_workspace_bytes(c.B, c.T, c.Hq, c.Hkv, c.D);
  DeviceBuffer<char> workspace(workspace_bytes);
  if (c.reference) {
    cuda_attention_reference_forward(out_gpu.get(), lse_gpu.get(), qkv_gpu.get(), c.B, c.T, c.Hq, c.Hkv, c.D, 0);
    cuda_attention_reference_backward(dqkv_gpu.get(), workspace.get(), dout_gpu.get(), qkv_gpu.get(), out_gpu.get(),
                                      lse_gpu.get(), c.B, c.T, c.Hq, c.Hkv, c.D, 0);
  } else {
    cuda_attention_forward(out_gpu.get(), lse_gpu.get(), qkv_gpu.get(), c.B, c.T, c.Hq, c.Hkv, c.D, 0);
    cuda_attention_backward(dqkv_gpu.get(), workspace.get(), dout_gpu.get(), qkv_gpu.get(), out_gpu.get(),
                            lse_gpu.get(), c.B, c.T, c.Hq, c.Hkv, c.D, 0);
  }

  EXPECT_LE(tolerance_ratio(to_float(out_gpu.download()), cpu.out, 2e-2, 2e-2), 1.0) << "out";
  EXPECT_LE(tolerance_ratio(lse_gpu.download(), cpu.lse, 2e-3, 1e-3), 1.0) << "lse";
  const std::vector<float> dqkv = to_float(dqkv_gpu.download());
  // Each of dq, dk and dv on its own, so a failure names the part that is wrong.
  const char* part_names[3] = {"dq", "dk", "dv"};
  const int64_t part_begin[4] = {0, static_cast<int64_t>(c.Hq) * c.D, static_cast<int64_t>(c.Hq + c.Hkv) * c.D, R};
  for (int part = 0; part < 3; ++part) {
    std::vector<float> gpu_part, cpu_part;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = part_begin[part]; j < part_begin[part + 1]; ++j) {
        gpu_part.push_back(dqkv[static_cast<size_t>(r * R + j)]);
        cpu_part.push_back(cpu.dqkv[static_cast<size_t>(r * R + j)]);
      }
    }
    EXPECT_LE(tolerance_ratio(gpu_part, cpu_part, 2e-2, 2e-2), 1.0) << part_names[part];
  }
}

std::vector<AttentionCase> attention_cases() {
  std::vector<AttentionCase> cases;
  for (const bool reference : {false, true}) {
    for (const int D : {64, 128}) {
      for (const int T : {1, 17, 64, 200, 1024}) {
        const int B = T >= 1024 ? 1 : 2;
        cases.push_back({B, T, 2, 2, D, reference});  // multi-head
        cases.push_back({B, T, 8, 2, D, reference});  // grouped-query: 4 query heads per key/value head
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttentionTest, ::testing::ValuesIn(attention_cases()), case_name);

// ALLOY_CUDA_ATTENTION=reference routes the public entry points to the reference kernels, whose
// results are deterministic (no atomics in the forward), so the two runs agree bit for bit.
TEST(CudaAttention, EnvironmentSelectsReferencePath) {
  ALLOY_REQUIRE_GPU();
  const int B = 1, T = 100, Hq = 4, Hkv = 2, D = 64;
  const int64_t R = static_cast<int64_t>(Hq + 2 * Hkv) * D;
  DeviceBuffer<bf16> qkv(to_bf16(random_floats(B * T * R, 1.0f, 5)));
  DeviceBuffer<bf16> out_direct(static_cast<int64_t>(B) * T * Hq * D), out_env(static_cast<int64_t>(B) * T * Hq * D);
  DeviceBuffer<float> lse_direct(static_cast<int64_t>(B) * Hq * T), lse_env(static_cast<int64_t>(B) * Hq * T);
  cuda_attention_reference_forward(out_direct.get(), lse_direct.get(), qkv.get(), B, T, Hq, Hkv, D, 0);
  setenv("ALLOY_CUDA_ATTENTION", "reference", 1);
  cuda_attention_forward(out_env.get(), lse_env.get(), qkv.get(), B, T, Hq, Hkv, D, 0);
  EXPECT_EQ(cuda_attention_backward_workspace_bytes(B, T, Hq, Hkv, D),
            cuda_attention_reference_backward_workspace_bytes(B, T, Hq, Hkv, D));
  unsetenv("ALLOY_CUDA_ATTENTION");
  EXPECT_EQ(to_float(out_direct.download()), to_float(out_env.download()));
  EXPECT_EQ(lse_direct.download(), lse_env.download());
}

// Neither check reaches the GPU, so these run everywhere.
TEST(CudaAttention, RejectsUnsupportedShapes) {
  EXPECT_THROW(cuda_attention_check_shape(12, 12, 96), Error);
  EXPECT_THROW(cuda_attention_check_shape(12, 5, 64), Error);
  EXPECT_THROW(cuda_attention_check_shape(0, 1, 64), Error);
  EXPECT_NO_THROW(cuda_attention_check_shape(12, 12, 64));
  EXPECT_NO_THROW(cuda_attention_check_shape(32, 8, 128));
  EXPECT_THROW(cuda_attention_backward_workspace_bytes(1, 16, 4, 4, 32), Error);
  // A qkv pointer off the 16-byte grid the fast kernels copy in.
  const auto* misaligned = reinterpret_cast<const bf16*>(uintptr_t{8});
  EXPECT_THROW(cuda_attention_forward(nullptr, nullptr, misaligned, 1, 16, 4, 4, 64, nullptr), Error);
}

TEST(CudaAttention, RejectsUnknownEnvironmentPath) {
  setenv("ALLOY_CUDA_ATTENTION", "fastest", 1);
  EXPECT_THROW(cuda_attention_forward(nullptr, nullptr, nullptr, 1, 16, 4, 4, 64, nullptr), Error);
  unsetenv("ALLOY_CUDA_ATTENTION");
}

}  // namespace
}  // namespace alloy::testing
