// Cost model: parameter counts against published sizes, the Megatron activation formula,
// collective algorithms, boundary paths, memory by ZeRO stage and recomputation, profiles.
#include <gtest/gtest.h>

#include "../support/specs.hpp"
#include "cost/cost_model.hpp"
#include "hw/catalog.hpp"
#include "spec/error.hpp"

namespace alloy {
namespace {

int64_t total_parameters(const ModelSpec& m) {
  return embedding_parameters(m) + m.num_layers * block_parameters(m) + head_parameters(m, !m.tied_embeddings);
}

TEST(LayerCost, ParameterCountsMatchPublishedModels) {
  // GPT-2 small: 124,439,808 parameters (tied head); LLaMA-2-7B: 6,738,415,616 (untied head).
  EXPECT_EQ(total_parameters(testing::gpt2("gpt2", 12, 768, 12, 50257, 1024)), 124439808);
  EXPECT_EQ(total_parameters(testing::llama2_7b()), 6738415616);
  // LLaMA-3-70B with grouped-query attention: 70,553,706,496.
  EXPECT_EQ(total_parameters(testing::llama3_70b()), 70553706496);
}

TEST(LayerCost, ActivationsFollowMegatronFormula) {
  // GPT-style block, 16-bit, no tp: s*b*h*(34 + 5*a*s/h) bytes.
  const ModelSpec m = testing::gpt2("gpt", 2, 1024, 16, 1000, 2048);
  const double s = 2048, b = 2, h = 1024, a = 16;
  const double none = block_activation_bytes(m, 2, 2048, 1, false, Recompute::Recompute_none, Precision::Precision_bf16);
  EXPECT_DOUBLE_EQ(none, s * b * h * (34 + 5 * a * s / h));
  // Selective drops the attention-score term; full keeps the block input only.
  EXPECT_DOUBLE_EQ(block_activation_bytes(m, 2, 2048, 1, false, Recompute::Recompute_selective, Precision::Precision_bf16),
                   s * b * h * 34);
  EXPECT_DOUBLE_EQ(block_activation_bytes(m, 2, 2048, 1, false, Recompute::Recompute_full, Precision::Precision_bf16),
                   2 * s * b * h);
  // tp t without sequence parallelism: sbh(10 + 24/t + 5as/(ht)); with it everything / t.
  const double t = 4;
  EXPECT_DOUBLE_EQ(block_activation_bytes(m, 2, 2048, 4, false, Recompute::Recompute_none, Precision::Precision_bf16),
                   s * b * h * (10 + 24 / t + 5 * a * s / (h * t)));
  EXPECT_DOUBLE_EQ(block_activation_bytes(m, 2, 2048, 4, true, Recompute::Recompute_none, Precision::Precision_bf16),
                   s * b * h * (34 + 5 * a * s / h) / t);
}

TEST(LayerCost, GroupedQueryAttentionStoresLessThanMultiHead) {
  ModelSpec mha = testing::llama("mha", 2, 4096, 32, 32, 11008, 32000);
  ModelSpec gqa = mha;
  gqa.num_kv_heads = 8;
  const auto bytes = [](const ModelSpec& m) {
    return block_activation_bytes(m, 1, 4096, 1, false, Recompute::Recompute_selective, Precision::Precision_bf16);
  };
  EXPECT_LT(bytes(gqa), bytes(mha));
  EXPECT_LT(block_parameters(gqa), block_parameters(mha));
}

TEST(Comm, RingAllReduceMatchesTextbookFormula) {
  GroupPlacement g;
  g.ranks = 8;
  g.intra_node = {"nvlink", 100e9, 1e-6};
  const double bytes = 1e9;
  EXPECT_NEAR(collective_seconds_with(CollectiveOp::CollectiveOp_all_reduce, bytes, g,
                                      CollectiveAlgorithm::CollectiveAlgorithm_ring),
              2 * 7 * (1e-6 + bytes / 8 / 100e9), 1e-12);
  // Small messages: the tree's log-depth latency wins.
  CollectiveAlgorithm chosen;
  collective_seconds(CollectiveOp::CollectiveOp_all_reduce, 1024, g, &chosen);
  EXPECT_EQ(chosen, CollectiveAlgorithm::CollectiveAlgorithm_tree);
}

TEST(Comm, HierarchicalBeatsFlatRingAcrossNodes) {
  GroupPlacement g;
  g.ranks = 32;
  g.nodes = 4;
  g.concurrent_per_node = 8;
  g.intra_node = {"nvlink", 300e9, 2e-6};
  g.network = {"infiniband", 25e9, 5e-6};
  CollectiveAlgorithm chosen;
  const double best = collective_seconds(CollectiveOp::CollectiveOp_all_reduce, 4e9, g, &chosen);
  EXPECT_EQ(chosen, CollectiveAlgorithm::CollectiveAlgorithm_hierarchical);
  EXPECT_LT(best, collective_seconds_with(CollectiveOp::CollectiveOp_all_reduce, 4e9, g,
                                          CollectiveAlgorithm::CollectiveAlgorithm_ring));
  // Spanning nodes costs more than staying inside one.
  GroupPlacement inside = g;
  inside.ranks = 8;
  inside.nodes = 1;
  EXPECT_LT(collective_seconds(CollectiveOp::CollectiveOp_all_reduce, 4e9, inside), best);
}

TEST(Comm, BoundaryPathFollowsPlacementAndVendor) {
  const ClusterSpec c = testing::cluster("mixed", {testing::a100_80(), testing::mi250x(), testing::v100_32()},
                                         {{0, 2, 4}, {1, 1, 4}, {2, 1, 4}});
  const ModelSpec m = testing::llama2_7b();
  const TrainSpec t = testing::train(2048, 8);
  CostModel cost(m, c, t);
  EXPECT_EQ(cost.boundary_link({0, 1}, {2, 3}).path, P2pPath::P2pPath_intra_node);
  EXPECT_EQ(cost.boundary_link({0, 1}, {4, 5}).path, P2pPath::P2pPath_network);
  EXPECT_EQ(cost.boundary_link({4, 5}, {12, 13}).path, P2pPath::P2pPath_network);   // a100 -> v100
  EXPECT_EQ(cost.boundary_link({4, 5}, {8, 9}).path, P2pPath::P2pPath_host_staged);  // nvidia -> amd
  const double bytes = 256e6;
  const double intra = boundary_seconds(bytes, cost.boundary_link({0, 1}, {2, 3}));
  const double net = boundary_seconds(bytes, cost.boundary_link({4, 5}, {12, 13}));
  const double staged = boundary_seconds(bytes, cost.boundary_link({4, 5}, {8, 9}));
  EXPECT_LT(intra, net);
  EXPECT_LT(net, staged);

  // A profile's measured transfers from the sender's type replace the cluster file's links, and
  // its calibrated extra adds to every transfer; other types keep theirs.
  Profile profile;
  profile.model_name = m.name;
  DeviceProfile& a100 = profile.device_types["a100-80"];
  a100.point_to_point = {{false, 1e9, 1e-3}, {true, 2e8, 2e-3}};
  a100.boundary_transfer_seconds = 0.5;
  CostModel measured(m, c, t, &profile);
  EXPECT_DOUBLE_EQ(boundary_seconds(bytes, measured.boundary_link({0, 1}, {2, 3})), 0.5 + 1e-3 + bytes / 2 / 1e9)
      << "two lanes share the bytes in a node";
  EXPECT_DOUBLE_EQ(boundary_seconds(bytes, measured.boundary_link({0, 1}, {4, 5})), 0.5 + 2e-3 + bytes / 2e8)
      << "one node on each side";
  EXPECT_DOUBLE_EQ(boundary_seconds(bytes, measured.boundary_link({8, 9}, {12, 13})),
                   boundary_seconds(bytes, cost.boundary_link({8, 9}, {12, 13})))
      << "an mi250x sender is not in the profile";
}

class StageCost : public ::testing::Test {
 protected:
  ModelSpec model = testing::llama2_7b();
  ClusterSpec cluster = testing::cluster("a100x8", {testing::a100_80()}, {{0, 1, 8}});
  TrainSpec train = testing::train(4096, 64);
  CostModel cost{model, cluster, train};

  MemoryBreakdown memory(int zero, int selective, int full, int offloaded, int dp = 8) {
    return memory_of(cost, zero, selective, full, offloaded, dp);
  }
  // The memory of one stage holding the whole model on dp devices, priced by `priced`.
  static MemoryBreakdown memory_of(const CostModel& priced, int zero, int selective, int full, int offloaded, int dp) {
    std::vector<int> ids;
    for (int i = 0; i < dp; ++i) ids.push_back(i);
    const StageShape shape = priced.stage_shape(ids, 1, dp, 1);
    const StageUnitCosts unit = priced.unit_costs(shape, false);
    StageChoice c;
    c.blocks = 32;
    c.selective = selective;
    c.full = full;
    c.offloaded = offloaded;
    c.zero = zero;
    c.has_embedding = c.has_head = true;
    return priced.stage_memory(shape, unit, c, 1, false);
  }
};

// A framework whose optimizer shards the master weights with its state (FSDP here) is priced so.
TEST_F(StageCost, FrameworksThatShardMasterWeightsUnderZeroOneArePricedSo) {
  ClusterSpec fsdp = cluster;
  fsdp.device_types[0].framework = "torchtitan-eager";
  const CostModel priced(model, fsdp, train);
  EXPECT_DOUBLE_EQ(memory_of(priced, 1, 0, 0, 0, 8).master_weights_bytes,
                   memory_of(priced, 0, 0, 0, 0, 8).master_weights_bytes / 8);
}

// FSDP keeps no bf16 shard under ZeRO 3 (it casts the fp32 shard as it gathers), and PyTorch's
// caching allocator reserves the allocated peak over (1 - its fragmentation).
TEST_F(StageCost, FsdpKeepsNoComputeShardAndReservesForFragmentation) {
  ClusterSpec fsdp = cluster;
  fsdp.device_types[0].framework = "torchtitan-eager";
  const CostModel priced(model, fsdp, train);
  const MemoryBreakdown torch3 = memory_of(priced, 3, 32, 0, 0, 8), alloy3 = memory(3, 32, 0, 0);
  EXPECT_DOUBLE_EQ(torch3.parameters_bytes, 0);
  EXPECT_GT(alloy3.parameters_bytes, 0);
  EXPECT_DOUBLE_EQ(torch3.master_weights_bytes, alloy3.master_weights_bytes);
  // Below ZeRO 3 the bf16 weights are whole in both.
  EXPECT_DOUBLE_EQ(memory_of(priced, 1, 32, 0, 0, 8).parameters_bytes, memory(1, 32, 0, 0).parameters_bytes);

  const double fragmentation = framework_runtime_traits("torchtitan-eager")->allocator_fragmentation;
  ASSERT_GT(fragmentation, 0);
  const double allocated = torch3.total_bytes() - torch3.framework_context_bytes - torch3.allocator_margin_bytes;
  EXPECT_NEAR(allocated / (torch3.total_bytes() - torch3.framework_context_bytes), 1 - fragmentation, 1e-12);
}

TEST_F(StageCost, ZeroStagesShardWhatTheyPromise) {
  const MemoryBreakdown z0 = memory(0, 0, 0, 0), z1 = memory(1, 0, 0, 0), z2 = memory(2, 0, 0, 0),
                        z3 = memory(3, 0, 0, 0);
  // Mixed precision with Adam: 2 + 2 + 4 + 8 bytes per parameter.
  EXPECT_DOUBLE_EQ(z0.optimizer_states_bytes, 4 * z0.parameters_bytes);
  EXPECT_DOUBLE_EQ(z0.master_weights_bytes, 2 * z0.parameters_bytes);
  EXPECT_DOUBLE_EQ(z1.optimizer_states_bytes, z0.optimizer_states_bytes / 8);
  // Alloy's GPU runtime makes its bf16 copy from whole fp32 master weights under ZeRO 1-2; ZeRO 3
  // shards them with the parameters.
  EXPECT_DOUBLE_EQ(z1.master_weights_bytes, z0.master_weights_bytes);
  EXPECT_DOUBLE_EQ(z2.master_weights_bytes, z0.master_weights_bytes);
  EXPECT_DOUBLE_EQ(z3.master_weights_bytes, z0.master_weights_bytes / 8);
  // Without shard_gradients, gradients accumulate in full over the step's micro-batches at every
  // ZeRO stage (the schedule reduces once per step), as the runtime measures (tests/parallel
  // DataParallelAtEveryZeroStage); gradient_shard_cost_test.cpp covers the sharded strategy.
  EXPECT_DOUBLE_EQ(z1.gradients_bytes, z0.gradients_bytes);
  EXPECT_DOUBLE_EQ(z2.gradients_bytes, z0.gradients_bytes);
  EXPECT_DOUBLE_EQ(z3.gradients_bytes, z0.gradients_bytes);
  EXPECT_DOUBLE_EQ(z3.parameters_bytes, z0.parameters_bytes / 8);
  EXPECT_GT(z3.zero3_gather_bytes, 0);
  EXPECT_LT(z3.total_bytes(), z2.total_bytes());
  EXPECT_DOUBLE_EQ(z2.total_bytes(), z1.total_bytes());
  EXPECT_LT(z1.total_bytes(), z0.total_bytes());
}

// A ZeRO-3 gather prefetched under the previous block's compute is hidden on an accelerator
// while it takes less time; on CPU devices it copies on the cores that compute and adds its time.
TEST(StageCostZero3, GathersAddTheirTimeOnCpuDevicesOnly) {
  const auto unit = [](const ModelSpec& model, const ClusterSpec& cluster, int64_t seq_len) {
    CostModel cost(model, cluster, testing::train(seq_len, 8));
    return cost.unit_costs(cost.stage_shape({0, 1}, 1, 2, 4), false);
  };
  const StageUnitCosts cpu = unit(model_load("small-gpt"), cluster_load("local-cpu-2", catalog_builtin()), 64);
  EXPECT_GT(cpu.zero3_forward_seconds, 0);
  EXPECT_DOUBLE_EQ(cpu.zero3_forward_seconds, cpu.zero3_backward_seconds) << "the whole gather, in each pass";
  // A 7B block's gather over NVLink takes less than its compute: nothing shows.
  const StageUnitCosts gpu =
      unit(testing::llama2_7b(), testing::cluster("a100x2", {testing::a100_80()}, {{0, 1, 2}}), 4096);
  EXPECT_EQ(gpu.zero3_forward_seconds, 0);
  EXPECT_EQ(gpu.zero3_backward_seconds, 0);
}

TEST(StageCostTied, ZeroKeepsATableTiedAcrossStagesWhole) {
  // GPT-2's token table is tied between the first and last stage and synchronised whole between
  // them: ZeRO shards the rest of the first stage's state, not the table (as the runtime does).
  const ModelSpec model = testing::gpt2("gpt", 4, 768, 12, 50257, 1024);
  const ClusterSpec cluster = testing::cluster("a100x8", {testing::a100_80()}, {{0, 1, 8}});
  const CostModel cost{model, cluster, testing::train(1024, 16)};
  const StageShape shape = cost.stage_shape({0, 1}, 1, 2, 1);
  const StageUnitCosts unit = cost.unit_costs(shape, false);
  StageChoice first;
  first.blocks = 2;
  first.has_embedding = true;
  const auto optimizer = [&](int zero) {
    StageChoice c = first;
    c.zero = zero;
    return cost.stage_memory(shape, unit, c, 1, true).optimizer_states_bytes;
  };
  const double table = 50257.0 * 768 * 8;  // two fp32 Adam moments
  EXPECT_DOUBLE_EQ(optimizer(1), (optimizer(0) - table) / 2 + table);
  // A stage holding both ends has no partner: everything shards.
  StageChoice both = first;
  both.has_head = true;
  both.zero = 1;
  StageChoice both0 = both;
  both0.zero = 0;
  EXPECT_DOUBLE_EQ(cost.stage_memory(shape, unit, both, 1, false).optimizer_states_bytes,
                   cost.stage_memory(shape, unit, both0, 1, false).optimizer_states_bytes / 2);
}

// The table kept whole (above) is also updated whole by every member: under ZeRO the optimizer
// step covers the member's share of the rest and all of the table.
TEST(StageCostTied, TableAcrossStagesUpdatesWholeOnEveryMember) {
  const ModelSpec model = testing::gpt2("gpt", 4, 768, 12, 50257, 1024);
  const ClusterSpec cluster = testing::cluster("a100x8", {testing::a100_80()}, {{0, 1, 8}});
  const CostModel cost{model, cluster, testing::train(1024, 16)};
  const StageShape shape = cost.stage_shape({0, 1}, 1, 2, 1);
  const StageUnitCosts unit = cost.unit_costs(shape, false);
  StageChoice first;
  first.blocks = 2;
  first.has_embedding = true;
  const auto optimizer_seconds = [&](const StageChoice& base, int zero) {
    StageChoice c = base;
    c.zero = zero;
    return cost.stage_timing(shape, unit, c, 0, 0).optimizer_seconds;
  };
  const double whole = optimizer_seconds(first, 0);
  const double table_share = 50257.0 * 768 / (2 * unit.block_parameters + unit.embedding_parameters);
  EXPECT_NEAR(optimizer_seconds(first, 2) / whole, (1 - table_share) / 2 + table_share, 1e-9);
  // A stage holding both ends shards everything.
  StageChoice both = first;
  both.has_head = true;
  EXPECT_NEAR(optimizer_seconds(both, 2) / optimizer_seconds(both, 0), 0.5, 1e-9);
}

TEST_F(StageCost, RecomputeAndOffloadTradeMemoryForTime) {
  // On GPUs attention is fused: no scores are kept, so selective recomputation drops nothing.
  EXPECT_DOUBLE_EQ(memory(0, 32, 0, 0).activations_bytes, memory(0, 0, 0, 0).activations_bytes);
  EXPECT_LT(memory(0, 0, 32, 0).activations_bytes, memory(0, 32, 0, 0).activations_bytes);
  const MemoryBreakdown off = memory(0, 0, 0, 32);
  EXPECT_LT(off.total_bytes(), memory(0, 0, 0, 0).total_bytes());
  EXPECT_GT(off.host_offload_bytes, 0);
  EXPECT_GT(off.offload_window_bytes, 0);
  EXPECT_GT(memory(0, 0, 0, 0).framework_context_bytes, 0);

  const StageShape shape = cost.stage_shape({0, 1, 2, 3, 4, 5, 6, 7}, 1, 8, 1);
  const StageUnitCosts unit = cost.unit_costs(shape, false);
  StageChoice plain;
  plain.blocks = 32;
  StageChoice full = plain;
  full.full = 32;
  EXPECT_GT(cost.stage_timing(shape, unit, full, 0, 0).backward_seconds,
            cost.stage_timing(shape, unit, plain, 0, 0).backward_seconds);
  EXPECT_GT(unit.recompute_full_seconds, unit.recompute_selective_seconds);
}

TEST_F(StageCost, FullRecomputationStopsBeforeTheMlpOutputProjection) {
  // Both runtimes keep a block's output (the next block's input), so recomputing a block runs
  // all of its forward but the (F -> C) projection: for LLaMA-2 7B at 4096 tokens that projection
  // is 2 x 4096 x 11008 x 4096 of the forward's FLOPs.
  const LayerWork work = block_work(model, 1, 4096, 1, false, train.precision);
  const double projection = 2.0 * 4096 * 11008 * 4096;
  EXPECT_NEAR(recompute_forward_share(work, Recompute::Recompute_full), 1 - projection / work.forward_flops, 1e-12);
  EXPECT_EQ(recompute_forward_share(work, Recompute::Recompute_none), 0);
  EXPECT_LT(recompute_forward_share(work, Recompute::Recompute_selective),
            recompute_forward_share(work, Recompute::Recompute_full));

  const StageUnitCosts one = cost.unit_costs(cost.stage_shape({0}, 1, 1, 1), false);
  EXPECT_NEAR(one.recompute_full_seconds,
              one.block.forward_seconds * recompute_forward_share(work, Recompute::Recompute_full), 1e-15);
  // Under tensor parallelism it redoes the attention's all-reduce but not the MLP's: of the
  // forward's two, one.
  const StageUnitCosts tp = cost.unit_costs(cost.stage_shape({0, 1}, 2, 1, 1), false);
  const LayerWork tp_work = block_work(model, 1, 4096, 2, false, train.precision);
  // The analytic backward computes twice the forward and carries the same two all-reduces, so
  // forward - backward / 2 is one all-reduce.
  const double all_reduce = tp.block.forward_seconds - tp.block.backward_seconds / 2;
  ASSERT_GT(all_reduce, 0);
  const double compute = tp.block.forward_seconds - 2 * all_reduce;
  EXPECT_NEAR(tp.recompute_full_seconds,
              compute * recompute_forward_share(tp_work, Recompute::Recompute_full) + all_reduce, 1e-12);
}

TEST_F(StageCost, SlowerDeviceTakesLonger) {
  ClusterSpec mixed = testing::cluster("av", {testing::a100_80(), testing::v100_32()}, {{0, 1, 1}, {1, 1, 1}});
  CostModel c2(model, mixed, train);
  const StageUnitCosts fast = c2.unit_costs(c2.stage_shape({0}, 1, 1, 1), false);
  const StageUnitCosts slow = c2.unit_costs(c2.stage_shape({1}, 1, 1, 1), false);
  EXPECT_GT(slow.block.forward_seconds, 2 * fast.block.forward_seconds);
}

TEST(Schedule, MicroBatchesInFlight) {
  EXPECT_EQ(schedule_micro_batches_in_flight(Schedule::Schedule_gpipe, 4, 0, 16, 1), 16);
  EXPECT_EQ(schedule_micro_batches_in_flight(Schedule::Schedule_1f1b, 4, 0, 16, 1), 4);
  EXPECT_EQ(schedule_micro_batches_in_flight(Schedule::Schedule_1f1b, 4, 3, 16, 1), 1);
  EXPECT_EQ(schedule_micro_batches_in_flight(Schedule::Schedule_1f1b, 4, 0, 2, 1), 2);
  // Interleaved holds more chunks on the first stage, each 1/v of the stage.
  EXPECT_GT(schedule_micro_batches_in_flight(Schedule::Schedule_interleaved, 4, 0, 16, 2), 4);
  // Uniform pipeline: (m - 1 + p) t with v = 1, (m + (p - 1)/v) t interleaved.
  EXPECT_DOUBLE_EQ(pipeline_step_seconds({1, 1, 1, 1}, {0, 0, 0, 0}, 8, 1), 11);
  EXPECT_DOUBLE_EQ(pipeline_step_seconds({1, 1, 1, 1}, {0, 0, 0, 0}, 8, 2), 9.5);
}

TEST(Profile, ParsesAndReplacesMeasuredShapes) {
  const std::string text = R"({"version": 1, "model": "llama-2-7b", "device_types": {"a100-80": {
      "layers": [{"layer": "block", "micro_batch": 1, "seq_len": 4096, "tp": 1,
                  "forward_seconds": 0.5, "backward_seconds": 1.0}],
      "collectives": [{"op": "all_reduce", "group_size": 8, "placement": "intra_node",
                       "bandwidth_bytes_per_second": 1e11, "latency_seconds": 1e-5},
                      {"op": "all_gather", "group_size": 8, "placement": "intra_node",
                       "bandwidth_bytes_per_second": 1e9, "latency_seconds": 0.25}]}}})";
  const Profile profile = profile_parse(text, "p.json");
  ASSERT_NE(profile.find_layer("a100-80", LayerKind::LayerKind_block, 1, 4096, 1, false), nullptr);
  EXPECT_NE(profile.find_collective("a100-80", CollectiveOp::CollectiveOp_all_reduce, 8, false), nullptr);

  const ModelSpec m = testing::llama2_7b();
  const ClusterSpec c = testing::cluster("a100x8", {testing::a100_80()}, {{0, 1, 8}});
  const TrainSpec t = testing::train(4096, 8);
  CostModel measured(m, c, t, &profile);
  const StageUnitCosts u = measured.unit_costs(measured.stage_shape({0}, 1, 1, 1), false);
  EXPECT_DOUBLE_EQ(u.block.forward_seconds, 0.5);
  EXPECT_DOUBLE_EQ(u.block.backward_seconds, 1.0);
  // A measured collective replaces the alpha-beta model for its group size and placement.
  const StageShape dp8 = measured.stage_shape({0, 1, 2, 3, 4, 5, 6, 7}, 1, 8, 1);
  StageChoice one;
  one.blocks = 1;
  one.zero = 1;  // all-reduce, then the updated weights' all-gather, both exposed: the one block
                 // is the last bucket, which starts only after the backward
  const StageTiming timing = measured.stage_timing(dp8, measured.unit_costs(dp8, false), one, 0, 0);
  // The gradients all-reduce in fp32 (beside fp32 master weights); the weights gather in bf16.
  const double grad_bytes = 4.0 * block_parameters(m), weight_bytes = 2.0 * block_parameters(m);
  EXPECT_NEAR(timing.gradient_sync_seconds, (1e-5 + grad_bytes / 1e11) + (0.25 + weight_bytes / 1e9), 1e-9);
  // Shapes it did not measure fall back to the analytic model and say so.
  measured.unit_costs(measured.stage_shape({0, 1}, 1, 2, 2), false);
  EXPECT_FALSE(measured.fallback_notes().empty());
}

// A CPU layer is profiled alone, its weights warm in the caches; inside the whole model it reads
// them cold, so its measured time gains what the CPU runtime's cold reads cost. A GPU's does not.
TEST(Profile, CpuLayersProfiledAloneReadTheirWeightsColdInTheModel) {
  const std::string text = R"({"version": 1, "model": "llama-2-7b", "device_types": {
      "cpu": {"layers": [{"layer": "block", "micro_batch": 1, "seq_len": 64, "tp": 1,
                          "forward_seconds": 0.5, "backward_seconds": 1.0}]},
      "a100-80gb-sxm": {"layers": [{"layer": "block", "micro_batch": 1, "seq_len": 64, "tp": 1,
                                    "forward_seconds": 0.5, "backward_seconds": 1.0}]}}})";
  const Profile profile = profile_parse(text, "p.json");
  const ModelSpec m = testing::llama2_7b();
  const TrainSpec t = testing::train(64, 8, Precision::Precision_fp32);
  const LayerWork block = block_work(m, 1, 64, 1, false, t.precision);
  for (const std::string device : {"cpu", "a100-80gb-sxm"}) {
    const ClusterSpec c = testing::catalog_cluster(device, "", 1);
    CostModel measured(m, c, t, &profile);
    const StageUnitCosts u = measured.unit_costs(measured.stage_shape({0}, 1, 1, 1), false);
    const double forward_cold = cold_weight_seconds(c.device_types[0], block, false);
    const double backward_cold = cold_weight_seconds(c.device_types[0], block, true);
    EXPECT_DOUBLE_EQ(u.block.forward_seconds, 0.5 + forward_cold) << device;
    EXPECT_DOUBLE_EQ(u.block.backward_seconds, 1.0 + backward_cold) << device;
    if (device == "cpu") {
      // 4 bytes of each of the block's 202M weights at 0.6 of the cpu entry's bandwidth, and
      // twice that in backward.
      EXPECT_NEAR(forward_cold, 4.0 * block_parameters(m) / (0.6 * c.device_types[0].memory_bandwidth_bytes_per_second), 1e-9);
      EXPECT_DOUBLE_EQ(backward_cold, 2 * forward_cold);
    } else {
      EXPECT_DOUBLE_EQ(forward_cold, 0);
    }
  }
}

TEST(Profile, WrittenProfilesReadBackUnchanged) {
  Profile p;
  p.model_name = "small-gpt";
  p.device_types["cpu-fast"].layers.push_back({LayerKind::LayerKind_head, 4, 64, 2, true, 0.0125, 0.03});
  p.device_types["cpu-fast"].collectives.push_back(
      {CollectiveOp::CollectiveOp_reduce_scatter, 3, true, 2.5e9, 4e-5, {{16384, 5e-5}, {4194304, 2e-3}}});
  p.device_types["cpu-half"].layers.push_back({LayerKind::LayerKind_embedding, 1, 32, 1, false, 1e-4, 2e-4});
  p.device_types["cpu-half"].point_to_point.push_back({true, 3e9, 7e-6});
  const Profile q = profile_parse(profile_to_json(p), "round.json");
  EXPECT_EQ(profile_to_json(q), profile_to_json(p));
  ASSERT_EQ(q.device_types.at("cpu-half").point_to_point.size(), 1u);
  EXPECT_TRUE(q.device_types.at("cpu-half").point_to_point[0].spans_nodes);
  EXPECT_EQ(q.model_name, "small-gpt");
  ASSERT_EQ(q.device_types.size(), 2u);
  const ProfiledLayer* head = q.find_layer("cpu-fast", LayerKind::LayerKind_head, 4, 64, 2, true);
  ASSERT_NE(head, nullptr);
  EXPECT_DOUBLE_EQ(head->forward_seconds, 0.0125);
  EXPECT_DOUBLE_EQ(head->backward_seconds, 0.03);
  const ProfiledCollective* rs = q.find_collective("cpu-fast", CollectiveOp::CollectiveOp_reduce_scatter, 3, true);
  ASSERT_NE(rs, nullptr);
  EXPECT_DOUBLE_EQ(rs->bandwidth_bytes_per_second, 2.5e9);
  EXPECT_DOUBLE_EQ(rs->latency_seconds, 4e-5);
  ASSERT_EQ(rs->samples.size(), 2u);
  EXPECT_DOUBLE_EQ(rs->samples[1].bytes, 4194304);
  EXPECT_DOUBLE_EQ(rs->samples[1].seconds, 2e-3);
  EXPECT_NE(q.find_layer("cpu-half", LayerKind::LayerKind_embedding, 1, 32, 1, false), nullptr);
}

// Micro-batch sizes between two measured ones follow the line through them, larger ones the
// largest's time per sequence; smaller ones than any measured are not guessed. With three sizes
// or more, a line fitted to them smooths one noisy timing.
TEST(Profile, LayerTimesBetweenMeasuredMicroBatches) {
  Profile p;
  p.model_name = "m";
  p.device_types["cpu"].layers.push_back({LayerKind::LayerKind_block, 2, 64, 1, false, 1.0, 2.0});
  p.device_types["cpu"].layers.push_back({LayerKind::LayerKind_block, 4, 64, 1, false, 2.0, 3.0});
  const auto at = [&](int b) { return p.layer_at("cpu", LayerKind::LayerKind_block, b, 64, 1, false); };
  Profile noisy = p;
  noisy.device_types["cpu"].layers.push_back({LayerKind::LayerKind_block, 8, 64, 1, false, 4.0, 5.0});
  noisy.device_types["cpu"].layers.push_back({LayerKind::LayerKind_block, 16, 64, 1, false, 8.0 * 1.25, 9.0});
  const auto fitted = noisy.layer_at("cpu", LayerKind::LayerKind_block, 8, 64, 1, false);
  ASSERT_TRUE(fitted);
  EXPECT_GT(fitted->forward_seconds, 4.0) << "pulled up by the slow timing at 16";
  EXPECT_LT(fitted->forward_seconds, 5.0);
  EXPECT_NEAR(fitted->backward_seconds, 5.0, 1e-9) << "points on one line are kept";
  ASSERT_TRUE(at(3));
  EXPECT_DOUBLE_EQ(at(3)->forward_seconds, 1.5);
  EXPECT_DOUBLE_EQ(at(3)->backward_seconds, 2.5);
  EXPECT_EQ(at(3)->micro_batch, 3);
  EXPECT_DOUBLE_EQ(at(4)->forward_seconds, 2.0);
  EXPECT_DOUBLE_EQ(at(8)->forward_seconds, 4.0);
  EXPECT_DOUBLE_EQ(at(8)->backward_seconds, 6.0);
  EXPECT_FALSE(at(1));
  EXPECT_FALSE(p.layer_at("cpu", LayerKind::LayerKind_block, 3, 32, 1, false)) << "another sequence length";
  EXPECT_FALSE(p.layer_at("gpu", LayerKind::LayerKind_block, 3, 64, 1, false));
}

// A GPU's layer times are bound by launches at small micro-batches and grow faster than a line
// at large ones (GPT-2 small's block forward on an H200, ms): the sizes near the one asked for
// price it, so the largest measured size reads its own time and those between stay within 3%.
TEST(Profile, LayerTimesFollowTheNearestSizesOnAGpu) {
  const std::vector<std::pair<int, double>> block_ms = {{1, 0.096}, {2, 0.123}, {4, 0.187},
                                                        {8, 0.322}, {16, 0.601}, {32, 1.241}};
  Profile p;
  p.model_name = "gpt2";
  for (const auto& [b, ms] : block_ms)
    p.device_types["h200"].layers.push_back({LayerKind::LayerKind_block, b, 1024, 1, false, ms * 1e-3, 2 * ms * 1e-3});
  for (const auto& [b, ms] : block_ms) {
    const auto at = p.layer_at("h200", LayerKind::LayerKind_block, b, 1024, 1, false);
    ASSERT_TRUE(at);
    EXPECT_NEAR(at->forward_seconds, ms * 1e-3, 0.03 * ms * 1e-3) << "micro-batch " << b;
  }
  EXPECT_NEAR(p.layer_at("h200", LayerKind::LayerKind_block, 32, 1024, 1, false)->forward_seconds, 1.241e-3, 1e-12);
  EXPECT_NEAR(p.layer_at("h200", LayerKind::LayerKind_block, 64, 1024, 1, false)->forward_seconds, 2 * 1.241e-3, 1e-12)
      << "past the largest size, its time per sequence";
  const auto between = p.layer_at("h200", LayerKind::LayerKind_block, 24, 1024, 1, false);
  ASSERT_TRUE(between);
  EXPECT_GT(between->forward_seconds, 0.601e-3);
  EXPECT_LT(between->forward_seconds, 1.241e-3);
}

// A CPU's collectives bend where buffers leave the cache: the samples are followed between
// them, their last segment past the largest, and the fit's rate below the smallest.
TEST(Profile, CollectiveTimesFollowTheSamples) {
  ProfiledCollective c{CollectiveOp::CollectiveOp_all_reduce, 2, false, 2e9, 1e-4,
                       {{1e4, 1.1e-4}, {4e6, 2.1e-3}, {16e6, 16.1e-3}}};
  EXPECT_DOUBLE_EQ(c.seconds(4e6), 2.1e-3);
  EXPECT_NEAR(c.seconds(10e6), 2.1e-3 + 6e6 * (14e-3 / 12e6), 1e-12);
  EXPECT_NEAR(c.seconds(32e6), 16.1e-3 + 16e6 * (14e-3 / 12e6), 1e-12);  // twice the straight fit's time
  EXPECT_GT(c.seconds(32e6), 1.9 * (c.latency_seconds + 32e6 / c.bandwidth_bytes_per_second));
  EXPECT_NEAR(c.seconds(5e3), 1.1e-4 - 5e3 / 2e9, 1e-12);
  c.samples.clear();  // a fit alone: latency + bytes / bandwidth
  EXPECT_DOUBLE_EQ(c.seconds(2e6), 1e-4 + 1e-3);
}

TEST(Profile, BadFilesNameTheField) {
  try {
    profile_parse(R"({"version": 1, "model": "x", "device_types": {"a": {"layers": [{"layer": "block",
        "micro_batch": 1, "seq_len": 8, "tp": 1, "forward_seconds": -1, "backward_seconds": 1}]}}})",
                  "bad.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.where().field, "device_types.a.layers[0].forward_seconds");
    EXPECT_EQ(e.where().file, "bad.json");
  }
  const std::string collective_start = R"({"version": 1, "model": "x", "device_types": {"a": {"collectives": [
      {"op": "all_reduce", "group_size": 2, "placement": "intra_node", "bandwidth_bytes_per_second": 1e9,
       "latency_seconds": 1e-5, "samples": )";
  for (const auto& [samples, field] : std::vector<std::pair<std::string, std::string>>{
           {"[[1024, 1e-5]]", "device_types.a.collectives[0].samples"},
           {"[[1024, 1e-5], [512, 2e-5]]", "device_types.a.collectives[0].samples[1]"},
           {"[[1024, 1e-5], [4096, -1]]", "device_types.a.collectives[0].samples[1]"}}) {
    try {
      profile_parse(collective_start + samples + "}]}}}", "samples.json");
      FAIL() << samples;
    } catch (const Error& e) {
      EXPECT_EQ(e.where().field, field) << samples;
      EXPECT_NE(e.hint().find("[[bytes, seconds]"), std::string::npos) << e.hint();
    }
  }
  for (const auto& [entry, field] : std::vector<std::pair<std::string, std::string>>{
           {R"("point_to_point": [{"placement": "far", "bandwidth_bytes_per_second": 1e9, "latency_seconds": 0}])",
            "device_types.a.point_to_point[0].placement"},
           {R"("point_to_point": [{"placement": "intra_node", "bandwidth_bytes_per_second": 1e9, "latency_seconds": -1}])",
            "device_types.a.point_to_point[0].latency_seconds"},
           {R"("point_to_point": {})", "device_types.a.point_to_point"}}) {
    try {
      profile_parse(R"({"version": 1, "model": "x", "device_types": {"a": {)" + entry + "}}}", "p2p.json");
      FAIL() << entry;
    } catch (const Error& e) {
      EXPECT_EQ(e.where().field, field) << entry;
    }
  }
  EXPECT_THROW(profile_parse(R"({"version": 7, "model": "x", "device_types": {}})", "v.json"), Error);
  EXPECT_THROW(profile_parse("{not json", "j.json"), Error);
  EXPECT_THROW(profile_load("/nonexistent/profile.json"), Error);
}

}  // namespace
}  // namespace alloy
