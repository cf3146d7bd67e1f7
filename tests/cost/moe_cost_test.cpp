// Mixture-of-Experts blocks in the cost model, against hand-computed figures on tiny-moe (C 64,
// 4 heads of 16, 2 kv heads, 4 routed experts of width 96, top-2, one shared expert of width 64).
#include <gtest/gtest.h>

#include <cmath>

#include "cost/cost_model.hpp"
#include "cost/moe_cost.hpp"
#include "hw/catalog.hpp"
#include "search/expert_placement.hpp"
#include "spec/error.hpp"

namespace alloy {
namespace {

// Attention 64x64 + 2 (64x32) + 64x64, two RMSNorms, the shared SwiGLU 3 (64x64), the router 64x4.
constexpr double kTinyDenseParameters = 12288 + 128 + 12288 + 256;
constexpr double kTinyExpertParameters = 3 * 64 * 96;  // 18,432

TEST(MoeCost, BlockParametersPerMemberFollowTheExpertsHeld) {
  const ModelSpec model = model_load("tiny-moe");
  EXPECT_EQ(moe_expert_parameters(model), 18432);
  EXPECT_DOUBLE_EQ(kTinyDenseParameters + 4 * kTinyExpertParameters,
                   static_cast<double>(model_parameter_counts(model).per_moe_block));
  const CostModel cost(model, cluster_load("local-cpu-2", catalog_builtin()), TrainSpec{});
  StageShape shape = cost.stage_shape({0, 1}, 1, 2, 2);
  EXPECT_DOUBLE_EQ(cost.unit_costs(shape, false).block_parameters, kTinyDenseParameters + 4 * kTinyExpertParameters);
  moe_shape_set(cost, &shape, {0, 1}, 2, 2, 0, 0);
  const StageUnitCosts two = cost.unit_costs(shape, false);
  EXPECT_DOUBLE_EQ(two.block_parameters, kTinyDenseParameters + 2 * kTinyExpertParameters);
  EXPECT_DOUBLE_EQ(two.block_expert_parameters, 2 * kTinyExpertParameters);
}

TEST(MoeCost, RoutedWorkAndDispatchBytes) {
  const ModelSpec model = model_load("tiny-moe");
  StageShape shape;
  shape.micro_batch = 2;
  shape.ep = 2;
  shape.held_experts = 2;
  // 2 sequences x 2 members x 32 tokens x top-2, half of them to this member's 2 experts.
  const MoeRoutedWork w = moe_routed_work(model, shape, 32, Precision::Precision_bf16);
  EXPECT_DOUBLE_EQ(w.routed_rows, 128);
  EXPECT_DOUBLE_EQ(w.work.forward_flops, 2.0 * 64 * 64 * 4 + 2.0 * 128 * kTinyExpertParameters);
  EXPECT_DOUBLE_EQ(w.work.backward_flops, 2 * w.work.forward_flops);
  EXPECT_DOUBLE_EQ(w.dispatch_bytes, 64.0 * 2 * 64 * 2);  // its 64 tokens x top-2 x C x bf16
  // Router probabilities 64x4, picks, weights and slots 64x2 each; the experts' outputs in its own
  // 128 rows; per arrived row (128, a whole number of the eighths of its own rows the runtime
  // rounds them up to) gate/up, SwiGLU and the arrived input.
  EXPECT_DOUBLE_EQ(w.activation_bytes, (64.0 * (4 + 6) + 128.0 * 64 + 128.0 * (3 * 96 + 64)) * 2);
  // The backward's peak: the input gradient (64 x C), the outputs' and gathered inputs' gradients
  // and the weights' (128 rows), three C-wide buffers of arrived rows and gate/up and SwiGLU
  // gradients per arrived row.
  EXPECT_DOUBLE_EQ(w.workspace_bytes, (64.0 * 64 + 128.0 * (2 * 64 + 1) + 128.0 * 3 * 64 + 128.0 * 3 * 96) * 2);
  // Arrived rows the runtime holds in buffers of whole eighths of its own rows: 129 take 144.
  shape.expert_load_factor = 129.0 / 128.0;
  const MoeRoutedWork rounded = moe_routed_work(model, shape, 32, Precision::Precision_bf16);
  EXPECT_DOUBLE_EQ(rounded.activation_bytes, (64.0 * (4 + 6) + 128.0 * 64 + 144.0 * (3 * 96 + 64)) * 2);
  // Without expert parallelism the experts run the own rows and the backward gathers them again.
  shape.ep = 1;
  shape.held_experts = 4;
  shape.expert_load_factor = 1;
  shape.expert_group_sequences = 2;
  const MoeRoutedWork whole = moe_routed_work(model, shape, 32, Precision::Precision_bf16);
  EXPECT_DOUBLE_EQ(whole.workspace_bytes, (64.0 * 64 + 128.0 * (2 * 64 + 1) + 128.0 * 64 + 128.0 * 3 * 96) * 2);
}

TEST(MoeCost, ImbalanceOfUniformRouting) {
  EXPECT_DOUBLE_EQ(moe_expected_imbalance(1000, 0.5, 1), 1.0);
  EXPECT_NEAR(expected_max_standard_normal(2), 0.5642, 0.03);  // 1 / sqrt(pi)
  EXPECT_NEAR(expected_max_standard_normal(8), 1.4236, 0.02);
  EXPECT_NEAR(moe_expected_imbalance(1000, 0.5, 2), 1.0 + expected_max_standard_normal(2) * std::sqrt(0.5 / 500), 1e-12);
  EXPECT_GT(moe_expected_imbalance(100, 0.125, 8), moe_expected_imbalance(10000, 0.125, 8));
}

TEST(MoeCost, AllToAllOverTwoNodes) {
  GroupPlacement g;
  g.ranks = 4;
  g.nodes = 2;
  g.concurrent_per_node = 2;
  g.intra_node.bandwidth_bytes_per_second = 100e9;
  g.network.bandwidth_bytes_per_second = 10e9;
  // A quarter of 1 MB to the peer on the node (2.5 us), half to the two on the other node over
  // half the NIC each (100 us), at once.
  EXPECT_NEAR(all_to_all_seconds(1e6, g), 100e-6, 1e-12);
  g.network.latency_seconds = 1e-6;
  EXPECT_NEAR(all_to_all_seconds(1e6, g), 103e-6, 1e-12);
  g.nodes = 1;
  g.network.latency_seconds = 0;
  EXPECT_NEAR(all_to_all_seconds(1e6, g), 7.5e-6, 1e-12);  // three quarters over the fabric
  EXPECT_EQ(all_to_all_seconds(1e6, GroupPlacement{}), 0);
}

TEST(MoeCost, ExpertParallelismCutsExpertMemoryAndAddsAllToAll) {
  const ModelSpec model = model_load("mixtral-8x7b");
  const CostModel cost(model, cluster_load("h100-a100", catalog_builtin()), TrainSpec{});
  std::vector<int> ids;
  for (int i = 0; i < 16; ++i) ids.push_back(i);
  StageShape one = cost.stage_shape(ids, 1, 16, 1);
  StageShape eight = one;
  moe_shape_set(cost, &eight, ids, 8, 1, 0, 0);
  const StageUnitCosts u1 = cost.unit_costs(one, false), u8 = cost.unit_costs(eight, false);
  EXPECT_EQ(u1.expert_all_to_all_seconds, 0);
  EXPECT_GT(u8.expert_all_to_all_seconds, 0);
  EXPECT_DOUBLE_EQ(u1.block_parameters - u8.block_parameters, 7.0 * moe_expert_parameters(model));
  StageChoice choice;
  choice.blocks = 32;
  choice.zero = 1;
  const MemoryBreakdown m1 = cost.stage_memory(one, u1, choice, 1, false), m8 = cost.stage_memory(eight, u8, choice, 1, false);
  EXPECT_LT(m8.parameters_bytes, m1.parameters_bytes / 3);
  // ZeRO shards all but the experts over all 16, and a member's experts over the 16 / 8 members
  // holding the same ones.
  EXPECT_NEAR(m8.optimizer_states_bytes,
              32 * 8.0 * ((u8.block_parameters - u8.block_expert_parameters) / 16 + u8.block_expert_parameters / 2), 1);
}

// DeepSeek-MoE-16B's first block (first_k_dense_replace 1) has the dense MLP of intermediate_size,
// not experts: the cost model prices it as the dense block it is, in parameters, memory and time.
TEST(MoeCost, LeadingDenseBlocksArePricedAsDenseBlocks) {
  const ModelSpec model = model_load("deepseek-moe-16b");
  const ModelParameterCounts counts = model_parameter_counts(model);
  const CostModel cost(model, cluster_load("h100-a100", catalog_builtin()), TrainSpec{});
  const StageShape shape = cost.stage_shape({0}, 1, 1, 1);
  const StageUnitCosts u = cost.unit_costs(shape, false);
  EXPECT_DOUBLE_EQ(u.dense_block.parameters, static_cast<double>(counts.per_block));
  EXPECT_DOUBLE_EQ(u.block_parameters, static_cast<double>(counts.per_moe_block));
  // One stage holding the whole model holds exactly its parameters.
  StageChoice whole;
  whole.blocks = 28;
  whole.has_embedding = whole.has_head = true;
  stage_choice_set_dense_blocks(&whole, 1);
  const double e = precision_bytes(TrainSpec{}.precision);
  EXPECT_DOUBLE_EQ(cost.stage_memory(shape, u, whole, 1, false).parameters_bytes / e, static_cast<double>(counts.total));
  // The dense block alone: its MLP's work (no router, no experts), its activations.
  StageChoice first;
  first.blocks = 1;
  stage_choice_set_dense_blocks(&first, 1);
  const StageTiming dense = cost.stage_timing(shape, u, first, 0, 0);
  EXPECT_DOUBLE_EQ(dense.forward_seconds, u.dense_block.times.forward_seconds);
  EXPECT_NE(dense.forward_seconds, u.block.forward_seconds);
  const double in_flight = 2;
  EXPECT_DOUBLE_EQ(cost.stage_memory(shape, u, first, in_flight, true).activations_bytes,
                   in_flight * u.dense_block.activation_bytes[0]);
  // Recomputation reaches the stage's first blocks first: with one fully recomputed block of
  // three, that is the dense one.
  StageChoice three;
  three.blocks = 3;
  three.full = 1;
  stage_choice_set_dense_blocks(&three, 1);
  EXPECT_EQ(three.dense_full, 1);
  EXPECT_DOUBLE_EQ(cost.stage_timing(shape, u, three, 0, 0).backward_seconds,
                   u.dense_block.times.backward_seconds + u.dense_block.recompute_full_seconds +
                       2 * u.block.backward_seconds);
}

// The runtime runs an MoE block's MLP whole on every tp rank (model_pass.cpp): its tensor-parallel
// collectives are its attention's alone, one sum per pass (under sequence parallelism two gathers
// and one reduce-scatter), where a dense block, its MLP split over tp, has two sums. Measured as
// what a 10x slower tp link adds to each kind of block.
TEST(MoeCost, MoeBlockSumsOnlyItsAttentionOverTp) {
  const ModelSpec model = model_load("tiny-moe");
  TrainSpec train;
  train.seq_len = 64;
  train.global_batch_sequences = 8;
  const ClusterSpec fast_cluster = cluster_load("a100-8", catalog_builtin());
  const CostModel fast(model, fast_cluster, train);
  ClusterSpec slow_cluster = fast_cluster;
  for (NodeGroup& g : slow_cluster.node_groups) {
    g.intra_node = fast.type_intra_node_link(g.device_type_index);
    g.intra_node.bandwidth_bytes_per_second /= 10;
  }
  const CostModel slow(model, slow_cluster, train);
  const int64_t micro_batch = 4;
  const double hidden = hidden_state_bytes(model, micro_batch, train.seq_len, train.precision);
  for (bool sp : {false, true}) {
    const StageShape fast_shape = fast.stage_shape({0, 1}, 2, 1, micro_batch);
    const StageShape slow_shape = slow.stage_shape({0, 1}, 2, 1, micro_batch);
    const auto added = [&](CollectiveOp op) {
      return collective_seconds(op, hidden, slow_shape.tp_group) - collective_seconds(op, hidden, fast_shape.tp_group);
    };
    const double gather = sp ? added(CollectiveOp::CollectiveOp_all_gather) : 0;
    const double sum = added(sp ? CollectiveOp::CollectiveOp_reduce_scatter : CollectiveOp::CollectiveOp_all_reduce);
    ASSERT_GT(sum, 0);
    const StageUnitCosts f = fast.unit_costs(fast_shape, sp);
    const StageUnitCosts s = slow.unit_costs(slow_shape, sp);
    const double tolerance = 1e-9 * sum;
    EXPECT_NEAR(s.block.forward_seconds - f.block.forward_seconds, 2 * gather + sum, tolerance) << sp;
    EXPECT_NEAR(s.block.backward_seconds - f.block.backward_seconds, 2 * gather + sum, tolerance) << sp;
    EXPECT_NEAR(s.dense_block.times.forward_seconds - f.dense_block.times.forward_seconds, 2 * gather + 2 * sum,
                tolerance)
        << sp;
    EXPECT_NEAR(s.dense_block.times.backward_seconds - f.dense_block.times.backward_seconds, 2 * gather + 2 * sum,
                tolerance)
        << sp;
    // Full recomputation redoes the attention's sum and both gathers, in either kind.
    EXPECT_NEAR(s.recompute_full_seconds - f.recompute_full_seconds, 2 * gather + sum, tolerance) << sp;
    EXPECT_NEAR(s.dense_block.recompute_full_seconds - f.dense_block.recompute_full_seconds, 2 * gather + sum, tolerance)
        << sp;
  }
}

TEST(MoeCost, MeasuredRoutingSharesAndSkew) {
  const ModelSpec model = model_load("tiny-moe");
  // Three layers x 4 experts as the step log writes them (the dense block's row is 0).
  const std::vector<double> shares = moe_expert_shares(model, {0, 0, 0, 0, 10, 20, 30, 40, 30, 20, 10, 40});
  ASSERT_EQ(shares.size(), size_t{4});
  EXPECT_DOUBLE_EQ(shares[0], 0.2);
  EXPECT_DOUBLE_EQ(shares[3], 0.4);
  EXPECT_DOUBLE_EQ(moe_routing_skew(shares, 0, 2), 0.8);  // 40% of the picks on half the experts
  EXPECT_DOUBLE_EQ(moe_even_split_skew(shares, 2), 1.2);
  EXPECT_DOUBLE_EQ(moe_routing_skew({}, 0, 2), 1.0);
  EXPECT_THROW(moe_expert_shares(model, {1, 2, 3}), Error);
  TrainSpec train;
  train.expert_tokens = {1, 2, 3};
  EXPECT_THROW(CostModel(model, cluster_load("local-cpu-2", catalog_builtin()), train), Error);
}

TEST(MoePlacement, ExpertsByMeasuredLoad) {
  // Equal members: loads as near halves as whole experts allow.
  EXPECT_EQ(expert_counts_by_load({1, 1}, {0.4, 0.1, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05}), (std::vector<int>{2, 6}));
  // A member three times as fast takes about three quarters of the load.
  EXPECT_EQ(expert_counts_by_load({3, 1}, {0.125, 0.125, 0.125, 0.125, 0.125, 0.125, 0.125, 0.125}),
            (std::vector<int>{6, 2}));
  EXPECT_EQ(expert_counts_by_load({1, 1, 1}, {0.9, 0.05, 0.05}), (std::vector<int>{1, 1, 1}));  // at least one each
}

TEST(MoePlacement, ExpertsInProportionToSpeed) {
  EXPECT_EQ(expert_counts_by_speed({3, 1}, 8), (std::vector<int>{6, 2}));
  EXPECT_EQ(expert_counts_by_speed({1, 1, 1}, 8), (std::vector<int>{3, 3, 2}));
  EXPECT_EQ(expert_counts_by_speed({10, 1, 1}, 4), (std::vector<int>{2, 1, 1}));  // at least one each
  EXPECT_EQ(expert_counts_by_speed({989, 312}, 8), (std::vector<int>{6, 2}));
}

}  // namespace
}  // namespace alloy
