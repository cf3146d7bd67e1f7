// The GPU model against the CPU model on the same (bf16-rounded) weights and tokens: the loss and
// every parameter's gradient after one forward and a scaled backward, whole or in two pieces,
// for GPT-2 and LLaMA (GQA) blocks, with and without full recomputation.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <string>

#include "../common/test_util.hpp"
#include "cuda_test_util.hpp"
#include "runtime/cuda/gpu_model.hpp"
#include "runtime/model.hpp"
#include "spec/error.hpp"
#include "spec/model.hpp"

namespace alloy {
namespace {

constexpr const char* kGpt2 = R"(name: gpu-test-gpt
family: gpt2
layers: 2
hidden_size: 128
heads: 2
ffn_hidden_size: 512
vocab_size: 300
max_seq_len: 96
)";

constexpr const char* kLlama = R"(name: gpu-test-llama
family: llama
layers: 2
hidden_size: 256
heads: 4
kv_heads: 2
ffn_hidden_size: 352
vocab_size: 300
max_seq_len: 96
tied_embeddings: false
)";

ModelSpec spec_from(const char* yaml) {
  testing::TempDir dir;
  return model_load_file(dir.write("model.yaml", yaml));
}

std::vector<int32_t> tokens(int count, int vocab, uint64_t seed) {
  std::vector<int32_t> out(static_cast<size_t>(count));
  uint64_t state = seed;
  for (int32_t& t : out) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    t = static_cast<int32_t>((state >> 33) % static_cast<uint64_t>(vocab));
  }
  return out;
}

double l2(const float* x, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += double{x[i]} * x[i];
  return std::sqrt(sum);
}

struct Case {
  const char* yaml;
  Recompute recompute;
  int B, T;
  int split;  // the backward runs blocks [split, L), then [0, split); 0: in one piece
};

// What the backward adds, as the executor scales a micro-batch of B in a global batch of 2 B.
constexpr float kLossScale = 0.5f;

class GpuModelTest : public ::testing::TestWithParam<Case> {};

TEST_P(GpuModelTest, LossAndGradientsMatchCpuModel) {
  ALLOY_REQUIRE_GPU();
  const Case c = GetParam();
  const ModelSpec spec = spec_from(c.yaml);
  Arena host_arena(int64_t{1} << 32);
  Model cpu(spec, host_arena);
  model_init_weights(cpu, 11);
  // Both sides compute from the same bf16 weights.
  for (int64_t i = 0; i < cpu.num_parameters; ++i) cpu.params[i] = __bfloat162float(__float2bfloat16(cpu.params[i]));
  const int N = c.B * c.T;
  const auto inputs = tokens(N, static_cast<int>(spec.vocab_size), 1);
  const auto targets = tokens(N, static_cast<int>(spec.vocab_size), 2);

  const int L = static_cast<int>(spec.num_layers);
  cpu.recompute.assign(static_cast<size_t>(L), c.recompute);  // the GPU model follows its host's levels
  Arena gpu_arena(int64_t{4} << 30, "gpu", cuda_arena_memory());
  GpuModel gpu(cpu, gpu_arena, nullptr);
  GpuActivations pass;
  gpu_activations_begin(gpu, pass, inputs.data(), targets.data(), c.B, c.T);
  gpu_model_forward(gpu, pass);
  std::vector<float> losses(static_cast<size_t>(N));
  cuda_check(cudaMemcpy(losses.data(), pass.losses, losses.size() * sizeof(float), cudaMemcpyDeviceToHost), "losses");
  const double gpu_loss = std::accumulate(losses.begin(), losses.end(), 0.0) / N;
  if (c.split > 0) {
    gpu_model_backward(gpu, pass, c.split, L, kLossScale);
    EXPECT_EQ(pass.backward_next, c.split);
    EXPECT_EQ(pass.blocks[static_cast<size_t>(c.split)].out, nullptr) << "the top piece's blocks are freed";
  }
  gpu_model_backward(gpu, pass, 0, c.split > 0 ? c.split : L, kLossScale);
  EXPECT_EQ(pass.backward_next, 0);
  gpu_activations_release(gpu, pass);
  std::vector<float> gpu_grads(static_cast<size_t>(gpu.num_parameters));
  cuda_check(cudaMemcpy(gpu_grads.data(), gpu.grads, gpu_grads.size() * sizeof(float), cudaMemcpyDeviceToHost),
             "grads");
  const int64_t head_bytes = int64_t{gpu_logits_ld(spec.vocab_size)} * spec.hidden_size * 2;
  EXPECT_EQ(gpu_arena.bytes_in_use(), arena_rounded_bytes(gpu.num_parameters * 4) * 2 +
                                          arena_rounded_bytes(gpu.num_parameters * 2) + arena_rounded_bytes(head_bytes))
      << "activations left behind after the pass";

  model_zero_grad(cpu);
  const double cpu_loss = model_forward(cpu, inputs.data(), targets.data(), c.B, c.T);
  model_backward(cpu, kLossScale);
  EXPECT_NEAR(gpu_loss, cpu_loss, 0.01 * cpu_loss);

  double diff_total = 0, ref_total = 0;
  for (const TensorView& v : cpu.views) {
    std::vector<float> diff(static_cast<size_t>(v.numel));
    for (int64_t i = 0; i < v.numel; ++i) diff[i] = gpu_grads[v.offset + i] - cpu.grads[v.offset + i];
    const double err = l2(diff.data(), v.numel), ref = l2(cpu.grads + v.offset, v.numel);
    EXPECT_LE(err, 0.1 * ref + 1e-5) << v.name << ": |gpu - cpu| " << err << " against |cpu| " << ref;
    diff_total += err * err;
    ref_total += ref * ref;
  }
  EXPECT_LE(std::sqrt(diff_total), 0.05 * std::sqrt(ref_total));
}

INSTANTIATE_TEST_SUITE_P(Models, GpuModelTest,
                         ::testing::Values(Case{kGpt2, Recompute::Recompute_none, 2, 80, 0},
                                           Case{kGpt2, Recompute::Recompute_full, 3, 33, 1},
                                           Case{kLlama, Recompute::Recompute_none, 2, 96, 1},
                                           Case{kLlama, Recompute::Recompute_full, 1, 17, 0}),
                         [](const ::testing::TestParamInfo<Case>& param_info) {
                           const Case& c = param_info.param;
                           return std::string(c.yaml == kGpt2 ? "gpt2" : "llama") +
                                  (c.recompute == Recompute::Recompute_full ? "_full" : "_none") + "_B" +
                                  std::to_string(c.B) + "_T" + std::to_string(c.T) +
                                  (c.split > 0 ? "_pieces" : "");
                         });

TEST(GpuModel, RejectsTokensOutsideTheVocabulary) {
  ALLOY_REQUIRE_GPU();
  const ModelSpec spec = spec_from(kGpt2);
  Arena host_arena(int64_t{1} << 32);
  Model cpu(spec, host_arena);
  Arena gpu_arena(int64_t{1} << 30, "gpu", cuda_arena_memory());
  GpuModel gpu(cpu, gpu_arena, nullptr);
  std::vector<int32_t> inputs(8, 5), targets(8, 5);
  inputs[3] = 300;
  GpuActivations pass;
  EXPECT_THROW(gpu_activations_begin(gpu, pass, inputs.data(), targets.data(), 1, 8), Error);
}

TEST(GpuModel, BackwardPiecesComeTopFirst) {
  ALLOY_REQUIRE_GPU();
  const ModelSpec spec = spec_from(kGpt2);
  Arena host_arena(int64_t{1} << 32);
  Model cpu(spec, host_arena);
  Arena gpu_arena(int64_t{1} << 30, "gpu", cuda_arena_memory());
  GpuModel gpu(cpu, gpu_arena, nullptr);
  const std::vector<int32_t> ids = tokens(16, static_cast<int>(spec.vocab_size), 3);
  GpuActivations pass;
  gpu_activations_begin(gpu, pass, ids.data(), ids.data(), 2, 8);
  EXPECT_THROW(gpu_model_backward(gpu, pass, 0, 2, 1.0f), Error) << "a backward before the forward";
  gpu_model_forward(gpu, pass);
  EXPECT_THROW(gpu_model_backward(gpu, pass, 0, 1, 1.0f), Error) << "the lowest piece before the top one";
  gpu_model_backward(gpu, pass, 1, 2, 1.0f);
  gpu_model_backward(gpu, pass, 0, 1, 1.0f);
  gpu_activations_release(gpu, pass);
  cuda_check(cudaDeviceSynchronize(), "the passes");
}

}  // namespace
}  // namespace alloy
