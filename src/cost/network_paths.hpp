// Where a stage's data-parallel group and a stage boundary cross the cluster's network: the
// links of spec/topology.hpp turned into what the communication model prices (GroupPlacement,
// BoundaryLink). On a flat cluster (one network) the placements are the one-network ones.
#pragma once

#include <vector>

#include "cost/comm.hpp"
#include "spec/cluster.hpp"
#include "spec/model.hpp"
#include "spec/topology.hpp"

namespace alloy {

// Distinct nodes holding `ids`, and the most of them on one node.
int network_distinct_nodes(const ClusterSpec& cluster, const std::vector<int>& ids);
int network_busiest_node_count(const ClusterSpec& cluster, const std::vector<int>& ids);

// The dp ring of each tp rank of a stage whose `stage_ids` run tp fastest: members tp apart.
std::vector<std::vector<int>> network_dp_rings(const std::vector<int>& stage_ids, int tp, int dp);

// The data-parallel group of a stage whose `stage_ids` run tp fastest, then dp: the dp rings of
// all tp ranks run at once and share what they cross. `intra`: the fabric inside a node.
GroupPlacement network_dp_group(const ClusterSpec& cluster, const std::vector<int>& stage_ids, int tp, int dp,
                                const Link& intra);

// The network side of a boundary between two stages, every lane sending at once: the slowest
// NIC on the way with the longest path's latency, and the aggregate bandwidth (each side's nodes
// x their NICs, and no more than the rack uplinks or WAN give the lanes).
struct BoundaryNetwork {
  Link network;
  double aggregate_bytes_per_second = 0;
  std::string bottleneck;  // the link that bounds the aggregate, for people
  bool measured = false;   // `network` is a measured link between node groups
};
BoundaryNetwork network_boundary(const ClusterSpec& cluster, const std::vector<int>& from, const std::vector<int>& to);

// A boundary's lanes, all at once: the i-th device of the wider side to its partner on the other.
std::vector<TopologyHop> network_boundary_hops(const std::vector<int>& from, const std::vector<int>& to);

// The hops that carry a stage's data-parallel collective across nodes by `algorithm`, all at once
// (ring and tree: the dp rings of every tp rank; hierarchical: the rings across nodes; domains:
// the rings across domains). `group`: network_dp_group of the same devices.
std::vector<TopologyHop> network_dp_group_hops(const ClusterSpec& cluster, const std::vector<int>& stage_ids, int tp, int dp,
                                               const GroupPlacement& group, CollectiveAlgorithm algorithm);

// The part of each shared link's capacity that `hops` take, each moving `hop_bytes_per_second`
// (what one operation asks of the links while it runs alone), at most 1 a link; links no hop
// crosses are left out.
std::vector<SharedLinkShare> network_shared_link_shares(const ClusterSpec& cluster, const TopologySharedLinks& shared,
                                                        const std::vector<TopologyHop>& hops, double hop_bytes_per_second);

// Seconds to sum the gradient of an embedding table tied between the pipeline's first and last
// stage, as the runtime does before the optimizer step: over every replica of both stages, one ring
// per tp rank summing that rank's rows when the two stages have the same tp, else one ring of every
// rank summing whole tables. `gradient_bytes`: per element (Plan::gradient_bytes). 0 when the
// model's head is not tied or the pipeline has one stage (first and last ids equal).
double network_tied_table_seconds(const ClusterSpec& cluster, const ModelSpec& model, int gradient_bytes,
                                  const std::vector<int>& first_ids, int first_tp, const std::vector<int>& last_ids,
                                  int last_tp);

}  // namespace alloy
