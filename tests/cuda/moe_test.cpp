// Mixture-of-Experts on the GPU: the GPU model's MoE blocks against the CPU model on the same
// (bf16-rounded) weights and tokens (loss, load-balancing loss and every gradient, both balance
// forms, with and without recomputation); and a small MoE trained with expert parallelism over
// two GPU ranks against one GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "../common/test_util.hpp"
#include "cuda_test_util.hpp"
#include "runtime/cuda/gpu_model.hpp"
#include "runtime/model.hpp"
#include "runtime/cpu/moe.hpp"
#include "spec/model.hpp"

namespace alloy {
namespace {

// The fused GPU attention takes head_dim 64 or 128, so the models here have 2 heads of 64 (grouped
// into one key/value head) where the CPU tests' tiny-moe has 4 of 16.

// tiny-moe's blocks: a leading dense block, then 4 experts (top-2, renormalised) and a shared
// expert, the load-balancing loss pooled over the MoE blocks (Mixtral's form).
constexpr const char* kPooled = R"(name: gpu-moe-pooled
family: llama
layers: 3
hidden_size: 128
heads: 2
kv_heads: 1
ffn_hidden_size: 176
vocab_size: 256
max_seq_len: 64
tied_embeddings: false
moe:
  experts: 4
  experts_per_token: 2
  expert_ffn_hidden_size: 96
  shared_experts: 1
  shared_expert_ffn_hidden_size: 64
  first_dense_layers: 1
  norm_topk_prob: true
  router_aux_loss_coef: 0.01
  balance_loss: pooled
)";

// Per-block balance, no shared expert, routing weights not renormalised (DeepSeek-MoE's form).
constexpr const char* kPerBlock = R"(name: gpu-moe-per-block
family: llama
layers: 2
hidden_size: 128
heads: 2
kv_heads: 1
ffn_hidden_size: 128
vocab_size: 256
max_seq_len: 64
tied_embeddings: false
moe:
  experts: 8
  experts_per_token: 2
  expert_ffn_hidden_size: 64
  first_dense_layers: 0
  norm_topk_prob: false
  router_aux_loss_coef: 0.1
  balance_loss: per_block
)";

struct MoeCase {
  const char* model;  // a yaml text
  Recompute recompute;
  int B, T;
};

ModelSpec moe_spec_of(const char* model) {
  testing::TempDir dir;
  return model_load_file(dir.write("model.yaml", model));
}

std::vector<int32_t> moe_tokens(int count, int vocab, uint64_t seed) {
  std::vector<int32_t> out(static_cast<size_t>(count));
  uint64_t state = seed;
  for (int32_t& t : out) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    t = static_cast<int32_t>((state >> 33) % static_cast<uint64_t>(vocab));
  }
  return out;
}

double moe_l2(const std::vector<double>& x) {
  double sum = 0;
  for (double v : x) sum += v * v;
  return std::sqrt(sum);
}

class GpuMoeTest : public ::testing::TestWithParam<MoeCase> {};

TEST_P(GpuMoeTest, LossesAndGradientsMatchCpuModel) {
  ALLOY_REQUIRE_GPU();
  const MoeCase c = GetParam();
  const ModelSpec spec = moe_spec_of(c.model);
  Arena host_arena(int64_t{1} << 32);
  Model cpu(spec, host_arena);
  model_init_weights(cpu, 5);
  // Routers 30x larger than initialised: probabilities far enough apart that the bf16 logits pick
  // the experts the fp32 ones do. Both sides compute from the same bf16 weights.
  for (const BlockTensors& b : cpu.weights.blocks) {
    if (b.router_w == nullptr) continue;
    for (int64_t i = 0; i < spec.moe.num_experts * spec.hidden_size; ++i) b.router_w[i] *= 30.0f;
  }
  for (int64_t i = 0; i < cpu.num_parameters; ++i) cpu.params[i] = __bfloat162float(__float2bfloat16(cpu.params[i]));
  cpu.recompute.assign(static_cast<size_t>(spec.num_layers), c.recompute);
  const int N = c.B * c.T;
  const auto inputs = moe_tokens(N, static_cast<int>(spec.vocab_size), 1);
  const auto targets = moe_tokens(N, static_cast<int>(spec.vocab_size), 2);

  Arena gpu_arena(int64_t{2} << 30, "gpu", cuda_arena_memory());
  GpuModel gpu(cpu, gpu_arena, nullptr);
  GpuActivations pass;
  gpu_activations_begin(gpu, pass, inputs.data(), targets.data(), c.B, c.T);
  gpu_model_forward(gpu, pass);
  if (model_balance_is_pooled(spec)) {  // one replica: its own sums are the pooled ones
    const int E = static_cast<int>(spec.moe.num_experts);
    ASSERT_EQ(pass.balance_sums.size(), static_cast<size_t>(2 * E + 1));
    pass.balance_pooled = true;
    pass.aux_loss = moe_aux_loss_from_sums(pass.balance_sums.data(), pass.balance_sums[2 * static_cast<size_t>(E)], E);
  }
  std::vector<float> losses(static_cast<size_t>(N));
  cuda_check(cudaMemcpy(losses.data(), pass.losses, losses.size() * sizeof(float), cudaMemcpyDeviceToHost), "losses");
  const double gpu_loss = std::accumulate(losses.begin(), losses.end(), 0.0) / N;
  gpu_model_backward(gpu, pass, 0, static_cast<int>(spec.num_layers), 0.5f);
  const double gpu_aux = pass.aux_loss;
  gpu_activations_release(gpu, pass);
  std::vector<float> gpu_grads(static_cast<size_t>(gpu.num_parameters));
  cuda_check(cudaMemcpy(gpu_grads.data(), gpu.grads, gpu_grads.size() * sizeof(float), cudaMemcpyDeviceToHost),
             "grads");

  model_zero_grad(cpu);
  const double cpu_loss = model_forward(cpu, inputs.data(), targets.data(), c.B, c.T);
  model_backward(cpu, 0.5f);
  EXPECT_NEAR(gpu_loss, cpu_loss, 0.01 * cpu_loss);
  EXPECT_NEAR(gpu_aux, cpu.pass.aux_loss, 0.01 * cpu.pass.aux_loss);
  std::vector<double> diffs, refs;
  for (const TensorView& v : cpu.views) {
    std::vector<double> diff, ref;
    for (int64_t i = 0; i < v.numel; ++i) {
      diff.push_back(gpu_grads[static_cast<size_t>(v.offset + i)] - cpu.grads[v.offset + i]);
      ref.push_back(cpu.grads[v.offset + i]);
    }
    const double err = moe_l2(diff), norm = moe_l2(ref);
    EXPECT_LE(err, 0.1 * norm + 1e-5) << v.name << ": |gpu - cpu| " << err << " against |cpu| " << norm;
    diffs.push_back(err);
    refs.push_back(norm);
  }
  EXPECT_LE(moe_l2(diffs), 0.05 * moe_l2(refs));
}

INSTANTIATE_TEST_SUITE_P(Models, GpuMoeTest,
                         ::testing::Values(MoeCase{kPooled, Recompute::Recompute_none, 2, 32},
                                           MoeCase{kPooled, Recompute::Recompute_full, 3, 17},
                                           MoeCase{kPerBlock, Recompute::Recompute_none, 2, 64}),
                         [](const ::testing::TestParamInfo<MoeCase>& param_info) {
                           const MoeCase& c = param_info.param;
                           return std::string(c.model == kPerBlock ? "per_block" : "pooled") +
                                  (c.recompute == Recompute::Recompute_full ? "_full" : "_none");
                         });

// The pooled model with dp 2 and ep 2 on two ranks sharing this GPU (rows and gradients through host
// memory) follows the one-GPU run of the same global batch.
TEST(GpuMoe, ExpertParallelTrainingFollowsOneGpu) {
  ALLOY_REQUIRE_GPU();
  testing::mpi_test_environment_set();
  testing::TempDir dir;
  const std::string text = std::string(ALLOY_SOURCE_DIR) + "/examples/data/fsf_licenses.txt";
  ASSERT_EQ(testing::alloy("tokenize " + text + " -o " + dir.path() + "/data.bin").exit_code, 0);
  const std::string cluster = dir.write("h200-2.yaml", "name: h200-2\nnodes:\n  - {name: n, count: 1, device: h200-sxm, "
                                                       "devices_per_node: 2, host_memory: 64GiB, host_link: 25GB/s}\n");
  const std::string train = dir.write("train.yaml", "seq_len: 32\nglobal_batch: 8\nsteps: 6\nlearning_rate: 1.0e-3\n");
  const std::string model = dir.write("moe.yaml", kPooled);
  const std::string plan = dir.path() + "/ep.json";
  const auto planned = testing::alloy("plan --model " + model + " --cluster " + cluster + " --train " + train +
                                      " --dp 2 --ep 2 --tp 1 --pp 1 --zero 0 --no-offload -o " + plan);
  ASSERT_EQ(planned.exit_code, 0) << planned.output;
  const std::string common = " --model " + model + " --data " + dir.path() + "/data.bin --train " + train + " --no-progress";
  const auto one = testing::alloy("train --device cuda" + common + " --log " + dir.path() + "/one.jsonl");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const auto two = testing::run_command("mpirun -np 2 " + std::string(ALLOY_BINARY) +
                                            " train --device cuda --gpu 0 --gpu-comm host --plan " + plan +
                                            " --cluster " + cluster + common + " --log " + dir.path() + "/two.jsonl",
                                        300);
  ASSERT_EQ(two.exit_code, 0) << two.output;
  const std::vector<double> a = testing::logged(dir.path() + "/one.jsonl", "loss");
  const std::vector<double> b = testing::logged(dir.path() + "/two.jsonl", "loss");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 0.02 * a[i]) << "step " << i + 1;
  const std::vector<double> aux_one = testing::logged(dir.path() + "/one.jsonl", "aux_loss");
  const std::vector<double> aux_two = testing::logged(dir.path() + "/two.jsonl", "aux_loss");
  ASSERT_EQ(aux_two.size(), aux_one.size());
  for (size_t i = 0; i < aux_one.size(); ++i)
    EXPECT_NEAR(aux_two[i], aux_one[i], 0.02 * aux_one[i]) << "load-balancing loss, step " << i + 1;
}

}  // namespace
}  // namespace alloy
