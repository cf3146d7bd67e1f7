// The gradient sync lower bounds the planner prunes by (stage_gradient_reduce_bound,
// stage_gradient_sync_bound): never above stage_gradient_sync_seconds for any choice of a stage,
// on flat and tiered networks and with a measured profile whose times are not affine; and close
// to it where the reduction dominates, so that they prune.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "../support/specs.hpp"
#include "cost/cost_model.hpp"

namespace alloy {
namespace {

// Two sites of two racks each, one node of `per_node` a100s per rack; the racks 4:1
// oversubscribed and the sites joined by a 1 GB/s WAN with 2 ms latency; the last node behind a
// NIC 10x slower than the others.
ClusterSpec tiered_cluster(int per_node) {
  ClusterSpec c = testing::cluster("tiered", {testing::a100_80()},
                                   {{0, 1, per_node}, {0, 1, per_node}, {0, 1, per_node}, {0, 1, per_node}}, 25e9);
  c.sites = {Site{"east"}, Site{"west"}};
  c.wan = {"ethernet", 1e9, 2e-3};
  for (int r = 0; r < 4; ++r) {
    c.racks.push_back(Rack{"r" + std::to_string(r), r / 2, 0, 4, 1e-6});
    c.node_groups[r].rack = r;
    c.node_groups[r].site = r / 2;
  }
  c.node_groups[3].network = {"ethernet", 2.5e9, 20e-6};
  return c;
}

// Every stage placement of `tp` x `dp` consecutive devices.
std::vector<std::vector<int>> placements(const ClusterSpec& c, int tp, int dp) {
  std::vector<std::vector<int>> out;
  const int size = tp * dp;
  for (int first = 0; first + size <= static_cast<int>(c.devices.size()); first += size) {
    std::vector<int> ids(size);
    for (int i = 0; i < size; ++i) ids[i] = first + i;
    out.push_back(ids);
  }
  return out;
}

struct Checked {
  int choices = 0;
  double tightest = 0;  // largest bound / sync over the stages with a reduction
};

// Every ZeRO stage and gradient strategy, block count, embedding and head, micro-batch count and
// offloaded count of every placement of (tp, dp) against the bound for its unit costs.
void check_bounds(const CostModel& cost, int tp, int dp, int64_t micro_batch, Checked* checked) {
  const int layers = static_cast<int>(cost.model().num_layers);
  for (const std::vector<int>& ids : placements(cost.cluster(), tp, dp)) {
    const StageShape shape = cost.stage_shape(ids, tp, dp, micro_batch);
    const GradientReduceBound reduce = cost.stage_gradient_reduce_bound(shape);
    for (int sp = 0; sp <= (tp > 1 ? 1 : 0); ++sp) {
      const StageUnitCosts unit = cost.unit_costs(shape, sp == 1);
      for (int ends = 0; ends < 4; ++ends) {
        const GradientSyncBound bound = cost.stage_gradient_sync_bound(reduce, unit, ends & 1, ends & 2);
        EXPECT_GE(bound.per_block_seconds, 0);
        for (int blocks = 1; blocks <= layers; ++blocks) {
          const double least = std::max(bound.floor_seconds, bound.fixed_seconds + blocks * bound.per_block_seconds);
          double fastest = -1;
          for (int zero = 0; zero <= 3; ++zero)
            for (int shard = 0; shard <= (zero >= 2 ? 1 : 0); ++shard)
              for (int micro_batches : {1, 4})
                for (int offloaded : {0, blocks}) {
                  StageChoice c;
                  c.blocks = blocks;
                  c.zero = zero;
                  c.shard_gradients = shard == 1;
                  c.micro_batches = micro_batches;
                  c.offloaded = offloaded;
                  c.has_embedding = ends & 1;
                  c.has_head = ends & 2;
                  const double sync = cost.stage_gradient_sync_seconds(shape, unit, c);
                  EXPECT_LE(least, sync * (1 + 1e-12)) << "tp " << tp << " dp " << dp << " first device " << ids.front()
                                                       << " blocks " << blocks << " zero " << zero << " shard " << shard;
                  fastest = fastest < 0 ? sync : std::min(fastest, sync);
                  ++checked->choices;
                }
          if (fastest > 0) checked->tightest = std::max(checked->tightest, least / fastest);
        }
      }
    }
  }
}

TEST(SyncBound, NeverAboveTheSyncOfAnyChoiceOnTieredNetworks) {
  const ClusterSpec c = tiered_cluster(4);
  CostModel cost(testing::llama2_7b(), c, testing::train(1024, 32));
  Checked checked;
  for (int tp : {1, 2, 4})
    for (int dp : {2, 4, 8, 16 / tp})
      if (tp * dp <= 16) check_bounds(cost, tp, dp, 2, &checked);
  EXPECT_GT(checked.choices, 10000);
  // Across the WAN the reduction of a whole stage dwarfs one micro-batch's backward: the bound
  // comes within a few percent of the cheapest choice.
  EXPECT_GT(checked.tightest, 0.9);
}

TEST(SyncBound, NeverAboveTheSyncOfAnyChoiceOnAFlatNetwork) {
  const ClusterSpec c = testing::cluster("flat", {testing::a100_80()}, {{0, 2, 8}}, 25e9);
  CostModel cost(testing::gpt2("gpt2-small", 12, 768, 12, 50257, 1024), c, testing::train(1024, 64));
  Checked checked;
  for (int tp : {1, 2, 8})
    for (int dp : {2, 16 / tp})
      if (tp * dp <= 16) check_bounds(cost, tp, dp, 4, &checked);
  EXPECT_GT(checked.choices, 1000);
}

// A measured collective whose time per byte grows tenfold past 2 GB (buffers that no longer fit
// where they were fast): not concave in the bytes, so the bound may not draw a chord between
// one block's reduction and all blocks'; it must still hold.
TEST(SyncBound, HoldsWithAMeasuredProfile) {
  const ClusterSpec c = tiered_cluster(2);
  Profile profile;
  DeviceProfile& device = profile.device_types["a100-80"];
  for (CollectiveOp op : {CollectiveOp::CollectiveOp_all_reduce, CollectiveOp::CollectiveOp_reduce_scatter})
    for (int ranks : {2, 4, 8}) {
      ProfiledCollective m;
      m.op = op;
      m.group_size = ranks;
      m.spans_nodes = true;
      m.bandwidth_bytes_per_second = 2e9;
      m.latency_seconds = 1e-4;
      m.samples = {{1e8, 0.01}, {2e9, 0.2}, {3e10, 30}};  // 1e-10 s/B, then about 1e-9 s/B
      device.collectives.push_back(m);
    }
  CostModel cost(testing::llama2_7b(), c, testing::train(1024, 32), &profile);
  // The bound notes no fallback to the analytic model: it prices nothing a plan would show.
  for (const std::vector<int>& ids : placements(c, 1, 2)) cost.stage_gradient_reduce_bound(cost.stage_shape(ids, 1, 2, 2));
  EXPECT_TRUE(cost.fallback_notes().empty());
  Checked checked;
  for (int dp : {2, 4, 8}) check_bounds(cost, 1, dp, 2, &checked);
  EXPECT_GT(checked.choices, 1000);
}

TEST(SyncBound, ZeroWithoutAReduction) {
  const ClusterSpec c = tiered_cluster(4);
  CostModel cost(testing::llama2_7b(), c, testing::train(1024, 32));
  const GradientReduceBound one_replica = cost.stage_gradient_reduce_bound(cost.stage_shape({0, 1, 2, 3}, 4, 1, 2));
  EXPECT_EQ(one_replica.one_block_seconds, 0);
  EXPECT_EQ(one_replica.fixed_seconds, 0);
  EXPECT_EQ(one_replica.per_block_seconds, 0);
}

}  // namespace
}  // namespace alloy
