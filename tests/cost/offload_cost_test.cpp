// Offload in the cost model: the device window of (depth + 1) blocks, the host copy of weights,
// gradients, master weights and optimizer states, and the exposed host-link time by prefetch
// depth and bandwidth.
#include <gtest/gtest.h>

#include <algorithm>

#include "../support/specs.hpp"
#include "cost/cost_model.hpp"
#include "hw/catalog.hpp"

namespace alloy {
namespace {

struct OffloadSetup {
  ModelSpec model = testing::llama("llama-offload", 8, 2048, 16, 16, 5632, 32000);
  TrainSpec train = testing::train(1024, 8);
  ClusterSpec cluster;

  explicit OffloadSetup(double host_link_bytes_per_second) {
    cluster = testing::cluster("a100x1", {testing::a100_80()}, {{0, 1, 1}});
    cluster.node_groups[0].host_link_bytes_per_second = host_link_bytes_per_second;
  }
};

StageChoice offload_choice(int offloaded, int depth, int micro_batches) {
  StageChoice c;
  c.blocks = 8;
  c.offloaded = offloaded;
  c.prefetch_depth = depth;
  c.micro_batches = micro_batches;
  c.has_embedding = true;
  c.has_head = true;
  return c;
}

TEST(OffloadCost, WindowHoldsDepthPlusOneBlocksWithTheirGradients) {
  OffloadSetup setup(25e9);
  CostModel cost(setup.model, setup.cluster, setup.train);
  const StageShape shape = cost.stage_shape({0}, 1, 1, 1);
  const StageUnitCosts unit = cost.unit_costs(shape, false);
  const double params = static_cast<double>(block_parameters(setup.model));
  ASSERT_DOUBLE_EQ(unit.block_parameters, params);
  // bf16 weights (2 bytes) and fp32 gradient buffers (master weights on): 6 bytes per parameter.
  const double slot_bytes = params * (2 + 4);
  double previous = 0;
  for (int depth : {1, 2, 4, 8}) {
    const MemoryBreakdown m = cost.stage_memory(shape, unit, offload_choice(6, depth, 4), 1, false);
    EXPECT_DOUBLE_EQ(m.offload_window_bytes, std::min(6, depth + 1) * slot_bytes) << "depth " << depth;
    EXPECT_GE(m.offload_window_bytes, previous);
    previous = m.offload_window_bytes;
    // Host: bf16 weights, fp32 gradients, fp32 master copy and two fp32 Adam states.
    EXPECT_DOUBLE_EQ(m.host_offload_bytes, 6 * params * (2 + 4 + 4 + 8));
  }
  EXPECT_DOUBLE_EQ(cost.stage_memory(shape, unit, offload_choice(0, 4, 4), 1, false).offload_window_bytes, 0);
  // Offloading a block moves its state off the device: the resident terms shrink.
  const MemoryBreakdown none = cost.stage_memory(shape, unit, offload_choice(0, 1, 4), 1, false);
  const MemoryBreakdown some = cost.stage_memory(shape, unit, offload_choice(6, 1, 4), 1, false);
  EXPECT_DOUBLE_EQ(none.parameters_bytes - some.parameters_bytes, 6 * params * 2);
  EXPECT_DOUBLE_EQ(none.optimizer_states_bytes - some.optimizer_states_bytes, 6 * params * 8);
}

TEST(OffloadCost, HostStateShardsItsOptimizerPartOverTheReplicasFromZeroOne) {
  OffloadSetup setup(25e9);
  setup.cluster = testing::cluster("a100x4", {testing::a100_80()}, {{0, 1, 4}});
  setup.cluster.node_groups[0].host_link_bytes_per_second = 25e9;
  CostModel cost(setup.model, setup.cluster, setup.train);
  const StageShape shape = cost.stage_shape({0, 1, 2, 3}, 1, 4, 1);
  const StageUnitCosts unit = cost.unit_costs(shape, false);
  const double params = unit.block_parameters;
  for (int zero : {0, 1, 2}) {
    StageChoice c = offload_choice(6, 1, 4);
    c.zero = zero;
    // Weights (bf16) and gradients (fp32) whole on every replica, where they are reduced; the
    // master copy and two Adam states a quarter each from ZeRO 1 on.
    const double share = zero >= 1 ? 0.25 : 1.0;
    EXPECT_DOUBLE_EQ(cost.stage_memory(shape, unit, c, 1, false).host_offload_bytes,
                     6 * params * (2 + 4 + share * (4 + 8))) << "zero " << zero;
  }
}

TEST(OffloadCost, ExposedTimeOfOnePassByHand) {
  // Four blocks, 10 ms per copy, 4 ms of compute each, 25 ms of other work before the run:
  // the first copy plus 3 x 6 ms of excess, less the head start of depth copies (at most 25 ms).
  EXPECT_NEAR(offload_exposed_seconds(4, 1, 10e-3, 4e-3, 25e-3), 18e-3, 1e-12);
  EXPECT_NEAR(offload_exposed_seconds(4, 2, 10e-3, 4e-3, 25e-3), 8e-3, 1e-12);
  EXPECT_NEAR(offload_exposed_seconds(4, 4, 10e-3, 4e-3, 25e-3), 3e-3, 1e-12);
  // Compute longer than the copy: only the first copy can show, and a head start hides it.
  EXPECT_NEAR(offload_exposed_seconds(4, 1, 10e-3, 12e-3, 0), 10e-3, 1e-12);
  EXPECT_NEAR(offload_exposed_seconds(4, 1, 10e-3, 12e-3, 30e-3), 0, 1e-12);
  EXPECT_NEAR(offload_exposed_seconds(0, 4, 10e-3, 1e-3, 0), 0, 1e-12);
}

TEST(OffloadCost, StageTimeChargesTheCopiesOfBothPasses) {
  OffloadSetup setup(25e9);
  CostModel cost(setup.model, setup.cluster, setup.train);
  const StageShape shape = cost.stage_shape({0}, 1, 1, 1);
  const StageUnitCosts u = cost.unit_costs(shape, false);
  const double params = u.block_parameters;
  const int m = 4;
  const StageChoice c = offload_choice(5, 2, m);
  const StageTiming t = cost.stage_timing(shape, u, c, 0, 0);
  // Forward fetches the bf16 weights; backward the weights plus, after the first micro-batch,
  // the fp32 gradients so far, while the new gradients go back in parallel.
  const double fetch = params * 2 / 25e9;
  const double in = params * (2 + 4.0 * (m - 1) / m) / 25e9;
  const double out = params * 4 / 25e9;
  // The stage's first five blocks stream through the window: the embedding, then the head and
  // the three resident blocks in backward (which walks the blocks in reverse), around them.
  OffloadedPasses passes;
  passes.then = {5, fetch, out, u.block.forward_seconds, u.block.backward_seconds};
  passes.before_forward_seconds = u.embedding.forward_seconds;
  passes.after_forward_seconds = 3 * u.block.forward_seconds + u.head.forward_seconds;
  passes.before_backward_seconds = 3 * u.block.backward_seconds + u.head.backward_seconds;
  passes.after_backward_seconds = u.embedding.backward_seconds;
  const OffloadExposure window = offload_window_exposure(passes, 2, m);
  EXPECT_DOUBLE_EQ(t.offload_forward_seconds, window.forward_seconds);
  EXPECT_DOUBLE_EQ(t.offload_backward_seconds, window.backward_seconds);
  // Each pass waits at least for what the link carries beyond its blocks' compute, less the
  // work it could hide behind (the other pass's, its own resident blocks').
  const double hiding = passes.before_forward_seconds + passes.after_forward_seconds +
                        passes.before_backward_seconds + passes.after_backward_seconds;
  EXPECT_GE(t.offload_forward_seconds + t.offload_backward_seconds,
            5 * (fetch + in - u.block.forward_seconds - u.block.backward_seconds) - hiding);
  const StageTiming plain = cost.stage_timing(shape, u, offload_choice(0, 2, m), 0, 0);
  EXPECT_DOUBLE_EQ(t.forward_seconds - plain.forward_seconds, t.offload_forward_seconds);
  EXPECT_DOUBLE_EQ(t.backward_seconds - plain.backward_seconds, t.offload_backward_seconds);
  EXPECT_GT(t.offload_backward_seconds, 0);  // 5 blocks over PCIe do not hide behind 3
}

TEST(OffloadCost, DeeperPrefetchNeverSlowerAndHalfTheLinkSlower) {
  OffloadSetup fast_setup(25e9);
  OffloadSetup slow_setup(12.5e9);
  CostModel fast(fast_setup.model, fast_setup.cluster, fast_setup.train);
  CostModel slow(slow_setup.model, slow_setup.cluster, slow_setup.train);
  for (int64_t micro_batch : {1, 4}) {
    SCOPED_TRACE(::testing::Message() << "micro-batch " << micro_batch);
    const StageShape shape = fast.stage_shape({0}, 1, 1, micro_batch);
    const StageUnitCosts uf = fast.unit_costs(shape, false);
    const StageUnitCosts us = slow.unit_costs(shape, false);
    for (int offloaded : {1, 3, 8}) {
      double previous = -1;
      for (int depth : {1, 2, 4, 8}) {
        const StageChoice c = offload_choice(offloaded, depth, 4);
        const StageTiming tf = fast.stage_timing(shape, uf, c, 0, 0);
        const StageTiming ts = slow.stage_timing(shape, us, c, 0, 0);
        const double exposed = tf.offload_forward_seconds + tf.offload_backward_seconds;
        if (previous >= 0) {
          EXPECT_LE(exposed, previous) << offloaded << " blocks, depth " << depth;
        }
        previous = exposed;
        EXPECT_GE(ts.offload_forward_seconds, tf.offload_forward_seconds);
        EXPECT_GE(ts.offload_backward_seconds, tf.offload_backward_seconds);
        // All eight offloaded: nothing to hide the first copies behind but the head, so half
        // the bandwidth costs strictly more.
        if (offloaded == 8) {
          EXPECT_GT(ts.offload_backward_seconds, tf.offload_backward_seconds);
        }
      }
    }
  }
}

TEST(OffloadCost, HostMemoryShareIsTheNodeDividedByItsDevices) {
  OffloadSetup setup(25e9);
  setup.cluster = testing::cluster("two", {testing::a100_80()}, {{0, 1, 4}, {0, 1, 8}});
  setup.cluster.node_groups[0].host_memory_bytes = 400e9;
  setup.cluster.node_groups[1].host_memory_bytes = 1600e9;
  CostModel cost(setup.model, setup.cluster, setup.train);
  // The smaller share of the type's two groups: 100 GB vs 200 GB per device.
  EXPECT_DOUBLE_EQ(cost.host_memory_share_bytes(0), 100e9);
}

TEST(OffloadCost, ParkedActivationsLeaveTheDeviceForHostMemoryAndCostLinkTime) {
  OffloadSetup fast(25e9), slow(1e9);
  CostModel cost(fast.model, fast.cluster, fast.train);
  const StageShape shape = cost.stage_shape({0}, 1, 1, 1);
  const StageUnitCosts unit = cost.unit_costs(shape, false);
  const double in_flight = 3;
  StageChoice plain = offload_choice(0, 1, 4);
  StageChoice parked = plain;
  parked.parked_none = 5;
  const MemoryBreakdown a = cost.stage_memory(shape, unit, plain, in_flight, false);
  const MemoryBreakdown b = cost.stage_memory(shape, unit, parked, in_flight, false);
  // All but each block's output leaves, for every micro-batch in flight, into host memory.
  const double per_block = unit.block_activation_bytes[0] - unit.block_output_bytes;
  ASSERT_GT(per_block, 0);
  EXPECT_DOUBLE_EQ(a.activations_bytes - b.activations_bytes, in_flight * 5 * per_block);
  EXPECT_DOUBLE_EQ(b.host_offload_bytes - a.host_offload_bytes, in_flight * 5 * per_block);
  // The device keeps at least the block on its way out.
  EXPECT_GE(b.offload_window_bytes, per_block);
  EXPECT_LT(b.total_bytes(), a.total_bytes());
  // The copies cost time only when the link cannot keep up, and more on a slower link.
  const StageTiming fast_time = cost.stage_timing(shape, unit, parked, 0, 0);
  CostModel slow_cost(slow.model, slow.cluster, slow.train);
  const StageUnitCosts slow_unit = slow_cost.unit_costs(shape, false);
  const StageTiming slow_time = slow_cost.stage_timing(shape, slow_unit, parked, 0, 0);
  EXPECT_GE(slow_time.offload_backward_seconds + slow_time.offload_forward_seconds,
            fast_time.offload_backward_seconds + fast_time.offload_forward_seconds);
  EXPECT_GT(slow_time.offload_backward_seconds, 0);
  EXPECT_GT(slow_time.per_micro_batch_seconds(), cost.stage_timing(shape, unit, plain, 0, 0).per_micro_batch_seconds());
}

// An MoE model's leading dense block offloaded (it leads its stage, so it goes first) moves its
// own weights, gradients and states, not an MoE block's: priced at its size in host memory, in the
// offload window and on the host link.
TEST(OffloadCost, OffloadedLeadingDenseBlockIsPricedAtItsOwnSize) {
  const ModelSpec model = model_load("deepseek-moe-16b");
  ClusterSpec cluster = cluster_load("h100-a100", catalog_builtin());
  const double host_link = 25e9;
  for (NodeGroup& g : cluster.node_groups) g.host_link_bytes_per_second = host_link;
  const TrainSpec train = testing::train(1024, 8);
  const CostModel cost(model, cluster, train);
  const StageShape shape = cost.stage_shape({0}, 1, 1, 1);
  const StageUnitCosts u = cost.unit_costs(shape, false);
  const double dense = u.dense_block.parameters, moe = u.block_parameters;
  ASSERT_GT(dense, 0);
  ASSERT_GT(moe, 3 * dense);  // so that pricing one as the other would show
  const auto choice = [](int offloaded) {
    StageChoice c = offload_choice(offloaded, 1, 4);
    c.blocks = 4;
    stage_choice_set_dense_blocks(&c, 1);
    return c;
  };
  EXPECT_EQ(choice(1).dense_offloaded, 1);
  EXPECT_EQ(choice(3).dense_offloaded, 1);
  const MemoryBreakdown none = cost.stage_memory(shape, u, choice(0), 1, false);
  const MemoryBreakdown first = cost.stage_memory(shape, u, choice(1), 1, false);
  const MemoryBreakdown two = cost.stage_memory(shape, u, choice(2), 1, false);
  const double e = precision_bytes(train.precision), g = cost.gradient_element_bytes();
  // Host bytes per parameter are the same for both kinds (ZeRO 0): host memory in proportion to
  // the blocks' parameters; the device gives back the dense block's weights.
  EXPECT_DOUBLE_EQ(first.host_offload_bytes * moe, (two.host_offload_bytes - first.host_offload_bytes) * dense);
  EXPECT_DOUBLE_EQ(none.parameters_bytes - first.parameters_bytes, dense * e);
  EXPECT_DOUBLE_EQ(first.parameters_bytes - two.parameters_bytes, moe * e);
  // The window's slots take the largest offloaded block.
  EXPECT_DOUBLE_EQ(first.offload_window_bytes, dense * (e + g));
  EXPECT_DOUBLE_EQ(two.offload_window_bytes, 2 * moe * (e + g));
  // On the link: the dense block's own bytes, fetched behind the embedding in forward.
  EXPECT_DOUBLE_EQ(u.dense_block.offload_weights_seconds, dense * e / host_link);
  EXPECT_DOUBLE_EQ(u.dense_block.offload_gradients_seconds, dense * g / host_link);
  const OffloadExposure one = cost.stage_offload_exposure(u, choice(1));
  OffloadedPasses passes;
  passes.first = {1, u.dense_block.offload_weights_seconds, u.dense_block.offload_gradients_seconds,
                  u.dense_block.times.forward_seconds, u.dense_block.times.backward_seconds};
  passes.before_forward_seconds = u.embedding.forward_seconds;
  passes.after_forward_seconds = 3 * u.block.forward_seconds + u.head.forward_seconds;
  passes.before_backward_seconds = 3 * u.block.backward_seconds + u.head.backward_seconds;
  passes.after_backward_seconds = u.embedding.backward_seconds;
  const OffloadExposure window = offload_window_exposure(passes, 1, 4);
  EXPECT_DOUBLE_EQ(one.forward_seconds, window.forward_seconds);
  EXPECT_DOUBLE_EQ(one.backward_seconds, window.backward_seconds);
  // The optimizer updates the offloaded parameters in host memory and first waits for the dense
  // block's gradients, the stage's last to reach it, however many MoE blocks are offloaded too.
  const auto optimizer_extra = [&](int offloaded) {
    return cost.stage_timing(shape, u, choice(offloaded), 0, 0).optimizer_seconds -
           cost.stage_timing(shape, u, choice(0), 0, 0).optimizer_seconds - u.dense_block.offload_gradients_seconds;
  };
  EXPECT_GT(optimizer_extra(1), 0);
  EXPECT_NEAR(optimizer_extra(2) / optimizer_extra(1), (dense + moe) / dense, 1e-9);
}

// The window as the runtime runs it, on timelines worked out by hand (link and compute in units
// of seconds): a fetch waits for the previous one and for the slot the use `slots` before frees,
// at the end of a forward or once a backward's gradients are home.
TEST(OffloadCost, OffloadWindowRunsTheRuntimesSlots) {
  OffloadedPasses passes;
  passes.then = {3, 10, 10, 2, 4};  // weights 10 s each way, forward 2 s, backward 4 s
  // Depth 1, two slots over three blocks: F0 fetched 0-10, F1 10-20, F2 20-30 (waits 10 + 8 + 8),
  // B2 30-40 (the slot F1 freed at 22; waits 8, written back 44-54), B1 40-50 (waits 6, home
  // 54-64), B0 54-64 (the slot of B2's write-back; waits 10).
  OffloadExposure e = offload_window_exposure(passes, 1, 1);
  EXPECT_DOUBLE_EQ(e.forward_seconds, 26);
  EXPECT_DOUBLE_EQ(e.backward_seconds, 24);
  // Depth 2, three slots: the backward's fetches follow one another, 30-40, 40-50, 50-60.
  e = offload_window_exposure(passes, 2, 1);
  EXPECT_DOUBLE_EQ(e.forward_seconds, 26);
  EXPECT_DOUBLE_EQ(e.backward_seconds, 8 + 6 + 6);
  // One block, two micro-batches, 20 s of resident work in each pass: F0 0-10 (waits 10), B0
  // fetched 12-22 behind the resident work (from 12 to 32: no wait), home 36-46; the second
  // forward's fetch waits for that slot, 46-56 (waits 20), and its backward fetches the weights
  // and the gradients so far, 58-78 (from 58 to 78: no wait).
  passes.then.count = 1;
  passes.after_forward_seconds = 10;
  passes.before_backward_seconds = 10;
  e = offload_window_exposure(passes, 2, 2);
  EXPECT_DOUBLE_EQ(e.forward_seconds, (10 + 20) / 2.0);
  EXPECT_DOUBLE_EQ(e.backward_seconds, 0);
}

// A run of two kinds of blocks: the first fetch is the first kind's, every later block adds its
// own link excess over its compute, and the head start covers `depth` of the first fetches.
TEST(OffloadCost, ExposureOfARunOfTwoKindsOfBlocks) {
  const OffloadedRun dense{1, 2e-3, 1e-3}, moe{3, 10e-3, 4e-3};
  // 2 ms first fetch + 3 x 6 ms excess - min(1 ms, 2 ms head start).
  EXPECT_NEAR(offload_exposed_seconds(dense, moe, 1, 1e-3), 19e-3, 1e-12);
  // Backward order: the MoE blocks first, 10 ms + 2 x 6 ms + 1 ms, less 10 ms of head start.
  EXPECT_NEAR(offload_exposed_seconds(moe, dense, 2, 10e-3), 13e-3, 1e-12);
  // One kind alone is the one-kind formula.
  EXPECT_DOUBLE_EQ(offload_exposed_seconds(OffloadedRun{}, moe, 2, 5e-3), offload_exposed_seconds(3, 2, 10e-3, 4e-3, 5e-3));
  EXPECT_DOUBLE_EQ(offload_exposed_seconds(OffloadedRun{}, OffloadedRun{}, 1, 0), 0);
}

}  // namespace
}  // namespace alloy
