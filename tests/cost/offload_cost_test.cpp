// Offload in the cost model: the device window of (depth + 1) blocks, the host copy of weights,
// gradients, master weights and optimizer states, and the exposed host-link time by prefetch
// depth and bandwidth.
#include <gtest/gtest.h>

#include <algorithm>

#include "../support/specs.hpp"
#include "cost/cost_model.hpp"

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
  // Before the offloaded run (the stage's first five blocks): the embedding in forward; the head
  // and the three resident blocks in backward, which walks the blocks in reverse.
  const double before_forward = u.embedding.forward_seconds;
  const double before_backward = 3 * u.block.backward_seconds + u.head.backward_seconds;
  EXPECT_DOUBLE_EQ(t.offload_forward_seconds, offload_exposed_seconds(5, 2, fetch, u.block.forward_seconds, before_forward));
  EXPECT_DOUBLE_EQ(t.offload_backward_seconds,
                   offload_exposed_seconds(5, 2, std::max(in, out), u.block.backward_seconds, before_backward));
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

}  // namespace
}  // namespace alloy
