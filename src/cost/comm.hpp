// Communication cost: alpha-beta time of collectives (ring, tree, hierarchical) over a group's
// actual placement, and of stage-boundary transfers over the real path between two stages.
#pragma once

#include <string>

#include "cost/profile.hpp"
#include "spec/cluster.hpp"

namespace alloy {

// hierarchical: reduce-scatter inside each node, the op across nodes, all-gather inside;
// domains: the same with fast domains (racks, sites, node groups behind unequal NICs) for nodes.
enum class CollectiveAlgorithm {
  CollectiveAlgorithm_ring,
  CollectiveAlgorithm_tree,
  CollectiveAlgorithm_hierarchical,
  CollectiveAlgorithm_domains,
};
const char* collective_algorithm_name(CollectiveAlgorithm a);

// Where the members of one communication group sit.
struct GroupPlacement {
  int ranks = 1;
  int nodes = 1;                  // distinct nodes holding members
  int concurrent_per_node = 1;    // devices of a node using the network at the same time
  Link intra_node;                // fabric between members on one node
  Link network;                   // between nodes: the slowest NIC a hop crosses (bandwidth per
                                  // node), latency of the longest path between two members
  // Only on clusters with racks, sites or unequal NICs (src/cost/network_paths.hpp); 0: none.
  // A ring's share of the narrowest rack uplink or WAN port it crosses, the rings of the other
  // tp ranks crossing it at the same time: flat, and in the hierarchical step across nodes.
  double shared_bytes_per_second = 0;
  double shared_across_nodes_bytes_per_second = 0;
  // Fast domains the members span (1: none): a ring inside the slowest domain, and one of the
  // ranks_per_domain rings across domains, each as bandwidth per ring and latency per step.
  int domains = 1;
  int ranks_per_domain = 1;
  double inside_bytes_per_second = 0;
  double inside_latency_seconds = 0;
  double across_bytes_per_second = 0;
  double across_latency_seconds = 0;
  // A hop between nodes runs on a link measured between node groups (ClusterSpec::measured_links):
  // the links price the group, not a profile's collectives timed on an unknown path.
  bool crosses_measured_link = false;
};

// Seconds for one collective on `buffer_bytes` (all-reduce: the tensor; all-gather: the
// gathered output; reduce-scatter: the input). Picks the fastest algorithm unless one is forced.
double collective_seconds(CollectiveOp op, double buffer_bytes, const GroupPlacement& group,
                          CollectiveAlgorithm* chosen = nullptr);
double collective_seconds_with(CollectiveOp op, double buffer_bytes, const GroupPlacement& group,
                               CollectiveAlgorithm algorithm);

// `group` with every rate its collectives move bytes at divided by `factor` (latencies kept).
GroupPlacement group_bandwidth_divided(const GroupPlacement& group, double factor);

// The rate of one hop of the step that crosses the network by `algorithm` (ring and tree: the
// flat ring's; hierarchical: the ring across nodes; domains: the ring across domains), per ring.
double collective_network_hop_bytes_per_second(const GroupPlacement& group, CollectiveAlgorithm algorithm);

enum class P2pPath { P2pPath_intra_node, P2pPath_network, P2pPath_host_staged };
const char* p2p_path_name(P2pPath path);

// A stage boundary: `lanes` device pairs move one hidden-state tensor in parallel.
struct BoundaryLink {
  P2pPath path = P2pPath::P2pPath_network;
  int lanes = 1;
  Link intra_node;                        // when both stages share one node
  Link network;
  double aggregate_network_bytes_per_second = 0;  // nodes on the narrower side x per-node bandwidth,
                                                  // and no more than the rack uplinks or WAN carry
  double host_link_from_bytes_per_second = 0;     // host-staged only
  double host_link_to_bytes_per_second = 0;
  double extra_seconds = 0;  // per transfer, beyond the link (the sender's calibrated profile)
};

double boundary_seconds(double bytes, const BoundaryLink& link);

// Bytes one transfer across a stage boundary moves as the schedule sends it (src/plan/schedule.cpp):
// every tp rank of the receiving stage takes its replica's samples whole from one sender rank,
// so `hidden_bytes`, the hidden state of the whole micro-batch, crosses `receiving_tp` times.
// `sequence_shards`: each tp rank sends its 1/tp of the rows instead, so it crosses once
// (RuntimeTraits::pipeline_sends_sequence_shards, both stages sequence-parallel).
double boundary_transfer_bytes(double hidden_bytes, int receiving_tp, bool sequence_shards = false);
// Seconds of a boundary's sends per micro-batch and direction, as a stage's forward and backward
// each carry them: the activations' transfer (received by `to_tp` ranks) and their gradients'
// (received by `from_tp` ranks), averaged, so the two passes together take both.
double boundary_transfer_seconds(double hidden_bytes, const BoundaryLink& link, int from_tp, int to_tp,
                                 bool sequence_shards = false);

// Replaces `link`'s intra-node and network links with the sending type's measured transfers and
// sets its calibrated extra time per transfer, where `profile` (may be null) has them. A network
// link measured between the two node groups (`network_measured`) is kept: it is the path's own.
// Call it before deriving the aggregate network bandwidth from `link->network`.
void boundary_link_apply_profile(BoundaryLink* link, const Profile* profile, const std::string& sender_type,
                                 bool network_measured);

}  // namespace alloy
