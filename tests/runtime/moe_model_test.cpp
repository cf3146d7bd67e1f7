// The runtime's Mixture-of-Experts model on one rank: its named expert views and exact parameter
// count, its shards under tensor and expert parallelism, the activation bytes its passes keep, the
// routing counts it reports, and what it still refuses (Hugging Face conversion, plans the CPU
// ranks do not run).
#include <gtest/gtest.h>

#include <functional>
#include <numeric>

#include "plan/plan.hpp"
#include "runtime/activation_memory.hpp"
#include "runtime/io/hf_weights.hpp"
#include "runtime/model.hpp"
#include "runtime/stage_backend.hpp"
#include "runtime/trainer.hpp"
#include "spec/error.hpp"

namespace alloy {
namespace {

std::vector<int32_t> moe_tokens(int count, int vocab, int salt) {
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) tokens[static_cast<size_t>(i)] = (i * 37 + salt * 11 + 5) % vocab;
  return tokens;
}

TEST(MoeModel, ExpertsAreNamedViewsAndCountExactly) {
  const ModelSpec spec = model_load("tiny-moe");  // 3 blocks, the first dense; 4 experts, 1 shared
  Arena arena(int64_t{1} << 26, "host");
  Model model(spec, arena);
  EXPECT_EQ(model.num_parameters, model_parameter_counts(spec).total);
  EXPECT_EQ(model_view(model, "layers.0.mlp.gate_up.weight").shape, (std::vector<int64_t>{2 * 176, 64}));
  EXPECT_EQ(model_view(model, "layers.1.mlp.router.weight").shape, (std::vector<int64_t>{4, 64}));
  EXPECT_EQ(model_view(model, "layers.2.mlp.experts.3.gate_up.weight").shape, (std::vector<int64_t>{2 * 96, 64}));
  EXPECT_EQ(model_view(model, "layers.2.mlp.experts.3.down.weight").shape, (std::vector<int64_t>{64, 96}));
  EXPECT_EQ(model_view(model, "layers.1.mlp.shared.gate_up.weight").shape, (std::vector<int64_t>{2 * 64, 64}));
  EXPECT_EQ(model_view(model, "layers.1.mlp.shared.down.weight").shape, (std::vector<int64_t>{64, 64}));
  EXPECT_THROW(model_view(model, "layers.1.mlp.gate_up.weight"), Error);
  EXPECT_THROW(model_view(model, "layers.1.mlp.shared_gate.weight"), Error);  // tiny-moe's shared expert is ungated
  EXPECT_NE(model.weights.blocks[2].expert_down_w[3], nullptr);
  EXPECT_EQ(model.weights.blocks[0].router_w, nullptr);
}

// The arena's bytes after a forward equal the analytic formula at every recomputation level; the
// backward frees them all; the routing counts K picks per token in each MoE block, once.
TEST(MoeModel, ActivationsMatchTheFormulaAndRoutingIsCounted) {
  const ModelSpec spec = model_load("tiny-moe");
  const int B = 2, T = 12;
  const int64_t picks = int64_t{B} * T * spec.moe.experts_per_token;
  for (Recompute level : {Recompute::Recompute_none, Recompute::Recompute_selective, Recompute::Recompute_full}) {
    Arena arena(int64_t{1} << 28, "host");
    Model model(spec, arena);
    model_init_weights(model, 3);
    model.recompute.assign(model.recompute.size(), level);
    const std::vector<int32_t> inputs = moe_tokens(B * T, 256, 1), targets = moe_tokens(B * T, 256, 2);
    const int64_t before = arena.bytes_in_use();
    model_forward(model, inputs.data(), targets.data(), B, T);
    EXPECT_EQ(arena.bytes_in_use() - before,
              model_activation_bytes(spec, B, T, std::vector<Recompute>(3, level)))
        << recompute_name(level);
    // tiny-moe pools its balance statistics: both MoE blocks' rows, every pick once.
    ASSERT_TRUE(model.pass.balance_pooled);
    const std::vector<double>& sums = model.pass.balance_sums;
    ASSERT_EQ(sums.size(), size_t{2 * 4 + 1});
    EXPECT_EQ(sums[8], 2.0 * B * T);
    EXPECT_EQ(std::accumulate(sums.begin(), sums.begin() + 4, 0.0), 2.0 * static_cast<double>(picks));
    EXPECT_NEAR(std::accumulate(sums.begin() + 4, sums.begin() + 8, 0.0), 2.0 * B * T, 1e-3);  // probabilities
    EXPECT_GT(model.pass.aux_loss, 0.0f);
    model_backward(model);
    EXPECT_EQ(arena.bytes_in_use(), before) << "backward must free every activation";
    const std::vector<int64_t>& counts = model.moe_routing.expert_tokens;
    ASSERT_EQ(counts.size(), size_t{12});
    EXPECT_EQ(std::accumulate(counts.begin(), counts.begin() + 4, int64_t{0}), 0) << "block 0 is dense";
    EXPECT_EQ(std::accumulate(counts.begin() + 4, counts.begin() + 8, int64_t{0}), picks);
    EXPECT_EQ(std::accumulate(counts.begin() + 8, counts.end(), int64_t{0}), picks) << recompute_name(level);
  }
}

// Under tensor parallelism every rank holds the MoE MLP whole (it runs it on all token rows), and
// under expert parallelism a member holds only its experts, after its other tensors.
TEST(MoeModel, TensorParallelShardsHoldTheExpertsWholeAndExpertParallelOnesTheirOwn) {
  const ModelSpec spec = model_load("tiny-moe");
  Arena arena(int64_t{1} << 26, "host");
  ModelShard shard = shard_full(spec);
  shard.tp = 2;
  shard.tp_rank = 1;
  Model tp(spec, arena, shard);
  EXPECT_EQ(model_view(tp, "layers.1.mlp.experts.3.gate_up.weight").shape, (std::vector<int64_t>{2 * 96, 64}));
  EXPECT_EQ(model_view(tp, "layers.1.mlp.router.weight").shape, (std::vector<int64_t>{4, 64}));
  ModelShard split = shard_full(spec);
  split.ep = 2;
  split.ep_rank = 1;
  split.experts_per_member = {3, 1};
  Model member(spec, arena, split);
  EXPECT_THROW(model_view(member, "layers.1.mlp.experts.2.down.weight"), Error);
  const TensorView& last = model_view(member, "layers.2.mlp.experts.3.down.weight");
  EXPECT_EQ(last.offset + last.numel, member.num_parameters);
  EXPECT_EQ(shard_expert_range(spec, split, 0), (std::pair<int, int>{0, 3}));
  EXPECT_EQ(shard_expert_range(spec, split, 1), (std::pair<int, int>{3, 4}));
}

void expect_moe_refusal(const std::function<void()>& consume, const std::string& consumer) {
  try {
    consume();
    ADD_FAILURE() << "expected an error from " << consumer;
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("Mixture-of-Experts models (model tiny-moe"), std::string::npos) << e.format();
    EXPECT_NE(e.message().find(consumer), std::string::npos) << e.format();
  }
}

TEST(MoeModel, HuggingFaceConversionRefusesMoe) {
  const ModelSpec moe = model_load("tiny-moe");
  expect_moe_refusal([&] { hf_weights_import(moe, "/nonexistent/model.safetensors"); }, "Hugging Face weight import");
  expect_moe_refusal([&] { hf_weights_export(moe, {}); }, "Hugging Face weight export");
  expect_moe_refusal([&] { hf_config_json(moe); }, "Hugging Face config export");
}

// Data, expert and pipeline parallelism run on CPU ranks (tests/parallel/moe_dist_test.cpp); what
// they do not run is refused in one line naming the plan's field.
TEST(MoeModel, PlansTheCpuRanksDoNotRunAreRefused) {
  const ModelSpec moe = model_load("tiny-moe");
  TrainSpec train;
  train.seq_len = 16;
  train.global_batch_sequences = 4;
  const Plan one = trainer_one_stage(moe, train, TrainerOptions{}).plan;
  EXPECT_NO_THROW(stage_backend_check_moe("cpu", moe, one, "plan.json"));
  EXPECT_NO_THROW(stage_backend_check_moe("cuda", model_load("tiny-llama"), one, "plan.json"));
  const auto refusal = [&](const std::string& backend, const Plan& plan) {
    try {
      stage_backend_check_moe(backend, moe, plan, "plan.json");
    } catch (const Error& e) {
      EXPECT_EQ(e.format().find('\n'), e.format().rfind('\n')) << "two lines at most: " << e.format();
      return e.message() + " [" + e.where().field + "]";
    }
    return std::string("accepted");
  };
  const std::string prefix = "Mixture-of-Experts model tiny-moe (4 experts, 2 per token) with ";
  EXPECT_EQ(refusal("cuda", one), "accepted");
  Plan two = one;
  two.stages.push_back(two.stages.front());
  EXPECT_EQ(refusal("cuda", two), prefix + "pipeline parallelism (2 stages) on the cuda backend is not supported [stages]");
  EXPECT_EQ(refusal("metal", one), prefix + "the metal backend is not supported [--device]");
  ModelSpec gated = moe;
  gated.moe.shared_expert_gate = true;
  try {
    stage_backend_check_moe("cuda", gated, one, "plan.json");
    ADD_FAILURE() << "the cuda backend accepted the shared experts' gate";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("the shared experts' sigmoid gate on the cuda backend is not supported"),
              std::string::npos)
        << e.format();
  }
  EXPECT_NO_THROW(stage_backend_check_moe("cpu", gated, one, "plan.json"));
  Plan dp = trainer_one_stage(moe, train, TrainerOptions{}, nullptr, 2).plan;
  EXPECT_EQ(refusal("cpu", dp), "accepted");
  dp.stages[0].ep = 2;
  EXPECT_EQ(refusal("cpu", dp), "accepted");
  dp.stages[0].zero = 2;
  EXPECT_EQ(refusal("cpu", dp), "accepted");
  dp.stages[0].shard_gradients = true;
  EXPECT_EQ(refusal("cpu", dp), "accepted");
  dp.stages[0].zero = 3;
  EXPECT_EQ(refusal("cpu", dp), "accepted");
  Plan offload_ep = dp;
  offload_ep.stages[0].shard_gradients = false;
  offload_ep.stages[0].offload.assign(offload_ep.stages[0].offload.size(), false);
  offload_ep.stages[0].offload[1] = true;
  EXPECT_EQ(refusal("cpu", offload_ep), "accepted");
  EXPECT_TRUE(stage_backend_supports("cpu", offload_ep, 0).ok);
  // What offload never runs, for any model: sharded gradients on the offloading stage.
  offload_ep.stages[0].shard_gradients = true;
  EXPECT_EQ(refusal("cpu", offload_ep), "accepted");
  const StageSupport sharded = stage_backend_supports("cpu", offload_ep, 0);
  EXPECT_FALSE(sharded.ok);
  EXPECT_EQ(sharded.field, "stages[0].shard_gradients");
  Plan tp = one;
  tp.stages[0].tp = 2;
  EXPECT_EQ(refusal("cpu", tp), "accepted");
  Plan pp = one;
  pp.stages.push_back(pp.stages[0]);
  EXPECT_EQ(refusal("cpu", pp), "accepted");
  Plan offload = one;
  offload.stages[0].offload[1] = true;
  EXPECT_EQ(refusal("cpu", offload), "accepted");
  Plan pieces = dp;
  pieces.stages[0].replicas.assign(2, PlanReplica{});
  for (PlanReplica& r : pieces.stages[0].replicas) {
    r.device_type = pieces.stages[0].device_type;
    r.sequences = 1;
    r.pieces = 2;
  }
  EXPECT_EQ(refusal("cpu", pieces),
            prefix + "a data-parallel share run in several pieces is not supported [stages[0].replicas]");
}

}  // namespace
}  // namespace alloy
