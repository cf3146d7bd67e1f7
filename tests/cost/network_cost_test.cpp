// Transfers and collectives priced on the links they cross: slow NICs, rack uplinks shared by
// concurrent rings, two-level collectives where they win. Expected times computed by hand.
#include <gtest/gtest.h>

#include "../support/specs.hpp"
#include "cost/cost_model.hpp"
#include "cost/network_paths.hpp"
#include "spec/topology.hpp"

namespace alloy {
namespace {

constexpr double kNetLatency = 5e-6;  // the NICs' and the nodes' fabric (testing::cluster)

// Two groups of two nodes (one a100 each, 10 GB/s NICs), in racks r1 and r2 whose uplinks carry
// 1 GB/s: the path between the groups is 10x slower than inside them.
ClusterSpec net_two_racks(int devices_per_node) {
  ClusterSpec c = testing::cluster("two-racks", {testing::a100_80()}, {{0, 2, devices_per_node}, {0, 2, devices_per_node}}, 10e9,
                                   kNetLatency);
  c.racks = {Rack{"r1", -1, 1e9, 1, 0}, Rack{"r2", -1, 1e9, 1, 0}};
  c.node_groups[0].rack = 0;
  c.node_groups[1].rack = 1;
  return c;
}

TEST(NetworkCost, DataParallelAllReduceAcrossTheSlowLinkGoesTwoLevel) {
  const ClusterSpec c = net_two_racks(1);
  CostModel cost(testing::llama2_7b(), c, testing::train(2048, 8));
  const GroupPlacement g = cost.stage_shape({0, 1, 2, 3}, 1, 4, 1).dp_group;
  const double bytes = 1e9;
  // Flat ring: 2 x 3 steps of 1e9/4 bytes, the hops between racks at 1 GB/s.
  EXPECT_DOUBLE_EQ(collective_seconds_with(CollectiveOp::CollectiveOp_all_reduce, bytes, g,
                                           CollectiveAlgorithm::CollectiveAlgorithm_ring),
                   6 * (kNetLatency + 0.25e9 / 1e9));
  // Two-level: reduce-scatter inside each rack (1 step of 0.5e9 at 10 GB/s), all-reduce of
  // 0.5e9 across by two rings sharing each 1 GB/s uplink (2 steps of 0.25e9 at 0.5 GB/s),
  // all-gather inside: 1.1 s against 1.5 s.
  CollectiveAlgorithm chosen = CollectiveAlgorithm::CollectiveAlgorithm_ring;
  const double best = collective_seconds(CollectiveOp::CollectiveOp_all_reduce, bytes, g, &chosen);
  EXPECT_EQ(chosen, CollectiveAlgorithm::CollectiveAlgorithm_domains);
  EXPECT_DOUBLE_EQ(best, 2 * (kNetLatency + 0.5e9 / 10e9) + 2 * (kNetLatency + 0.25e9 / 0.5e9));
}

TEST(NetworkCost, PipelineSendAcrossTheSlowLinkMovesFarLess) {
  const ClusterSpec c = net_two_racks(1);
  CostModel cost(testing::llama2_7b(), c, testing::train(2048, 8));
  // Two lanes leave r1 at once: 0.5 GB/s each, 1 GB/s together (their NICs could do 20).
  const BoundaryLink link = cost.boundary_link({0, 1}, {2, 3});
  EXPECT_EQ(link.path, P2pPath::P2pPath_network);
  EXPECT_DOUBLE_EQ(link.aggregate_network_bytes_per_second, 1e9);
  EXPECT_DOUBLE_EQ(boundary_seconds(1e8, link), kNetLatency + 0.1);
  // Inside one rack the NICs bound it: 2 nodes x 10 GB/s.
  EXPECT_DOUBLE_EQ(cost.boundary_link({0}, {1}).aggregate_network_bytes_per_second, 10e9);
}

TEST(NetworkCost, RingsOfAllTensorRanksShareTheUplink) {
  // tp 2 x dp 2 over nodes 0 (r1) and 2 (r2): the dp rings {0, 4} and {1, 5} both leave r1 at once.
  const ClusterSpec c = net_two_racks(2);
  CostModel cost(testing::llama2_7b(), c, testing::train(2048, 8));
  const GroupPlacement g = cost.stage_shape({0, 1, 4, 5}, 2, 2, 1).dp_group;
  EXPECT_DOUBLE_EQ(g.shared_bytes_per_second, 0.5e9);
  EXPECT_DOUBLE_EQ(collective_seconds(CollectiveOp::CollectiveOp_all_reduce, 1e9, g),
                   2 * (kNetLatency + 0.5e9 / 0.5e9));
}

// What the simulator divides between stages: the part of each uplink an operation takes alone.
TEST(NetworkCost, AnOperationLimitedByAnUplinkTakesAllOfIt) {
  const ClusterSpec c = net_two_racks(2);
  const TopologySharedLinks shared = topology_shared_links(c);
  ASSERT_EQ(shared.links.size(), 4u);  // r1 and r2, out and in
  CostModel cost(testing::llama2_7b(), c, testing::train(2048, 8));
  // tp 2 x dp 2 across the racks: two rings each way share each 1 GB/s uplink, 0.5 GB/s a hop.
  const std::vector<int> ids = {0, 1, 4, 5};
  const GroupPlacement g = cost.stage_shape(ids, 2, 2, 1).dp_group;
  const CollectiveAlgorithm ring = CollectiveAlgorithm::CollectiveAlgorithm_ring;
  const double hop = collective_network_hop_bytes_per_second(g, ring);
  EXPECT_DOUBLE_EQ(hop, 0.5e9);
  const std::vector<SharedLinkShare> shares =
      network_shared_link_shares(c, shared, network_dp_group_hops(c, ids, 2, 2, g, ring), hop);
  ASSERT_EQ(shares.size(), 4u);
  for (const SharedLinkShare& s : shares) EXPECT_DOUBLE_EQ(s.share, 1.0) << shared.links[s.link].name;
  // A boundary of one lane from r1 to r2 at 0.25 GB/s takes a quarter of r1's out and r2's in.
  const std::vector<SharedLinkShare> send = network_shared_link_shares(c, shared, network_boundary_hops({0}, {4}), 0.25e9);
  ASSERT_EQ(send.size(), 2u);
  EXPECT_EQ(shared.links[send[0].link].name, "rack r1 uplink out");
  EXPECT_EQ(shared.links[send[1].link].name, "rack r2 uplink in");
  EXPECT_DOUBLE_EQ(send[0].share, 0.25);
  // Inside a rack nothing is shared.
  EXPECT_TRUE(network_shared_link_shares(c, shared, network_boundary_hops({0, 1}, {2, 3}), 10e9).empty());
}

TEST(NetworkCost, SlowNicOfOneGroupLimitsTheRing) {
  ClusterSpec c = testing::cluster("two-nics", {testing::a100_80()}, {{0, 2, 1}, {0, 2, 1}}, 10e9, kNetLatency);
  const GroupPlacement before = CostModel(testing::llama2_7b(), c, testing::train(2048, 8)).stage_shape({0, 1, 2, 3}, 1, 4, 1).dp_group;
  c.node_groups[1].network = {"ethernet", 1e9, kNetLatency};
  CostModel cost(testing::llama2_7b(), c, testing::train(2048, 8));
  const GroupPlacement g = cost.stage_shape({0, 1, 2, 3}, 1, 4, 1).dp_group;
  const CollectiveOp op = CollectiveOp::CollectiveOp_all_reduce;
  const CollectiveAlgorithm ring = CollectiveAlgorithm::CollectiveAlgorithm_ring;
  EXPECT_DOUBLE_EQ(collective_seconds_with(op, 1e9, before, ring), 6 * (kNetLatency + 0.25e9 / 10e9));
  EXPECT_DOUBLE_EQ(collective_seconds_with(op, 1e9, g, ring), 6 * (kNetLatency + 0.25e9 / 1e9));
  // Inside the slow group as slow as across: the two-level form saves only two steps' latency.
  EXPECT_DOUBLE_EQ(collective_seconds(op, 1e9, g), 4 * kNetLatency + 3 * 0.5e9 / 1e9);
}

TEST(NetworkCost, NetworksEqualToTheClustersPriceAsFlat) {
  ClusterSpec c = testing::cluster("same", {testing::a100_80()}, {{0, 2, 8}, {0, 2, 8}}, 25e9, kNetLatency);
  const std::vector<int> ids = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23};
  const GroupPlacement flat = CostModel(testing::llama2_7b(), c, testing::train(2048, 8)).stage_shape(ids, 8, 3, 1).dp_group;
  c.node_groups[1].network = c.network;
  EXPECT_TRUE(topology_is_flat(c));
  const GroupPlacement same = CostModel(testing::llama2_7b(), c, testing::train(2048, 8)).stage_shape(ids, 8, 3, 1).dp_group;
  EXPECT_EQ(collective_seconds(CollectiveOp::CollectiveOp_all_reduce, 1e9, flat),
            collective_seconds(CollectiveOp::CollectiveOp_all_reduce, 1e9, same));
  EXPECT_EQ(same.domains, 1);
}

}  // namespace
}  // namespace alloy
