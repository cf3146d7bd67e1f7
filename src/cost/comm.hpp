// Communication cost: alpha-beta time of collectives (ring, tree, hierarchical) over a group's
// actual placement, and of stage-boundary transfers over the real path between two stages.
#pragma once

#include <string>

#include "cost/profile.hpp"
#include "spec/cluster.hpp"

namespace alloy {

enum class CollectiveAlgorithm { CollectiveAlgorithm_ring, CollectiveAlgorithm_tree, CollectiveAlgorithm_hierarchical };
const char* collective_algorithm_name(CollectiveAlgorithm a);

// Where the members of one communication group sit.
struct GroupPlacement {
  int ranks = 1;
  int nodes = 1;                  // distinct nodes holding members
  int concurrent_per_node = 1;    // devices of a node using the network at the same time
  Link intra_node;                // fabric between members on one node
  Link network;                   // between nodes; bandwidth per node
};

// Seconds for one collective on `buffer_bytes` (all-reduce: the tensor; all-gather: the
// gathered output; reduce-scatter: the input). Picks the fastest algorithm unless one is forced.
double collective_seconds(CollectiveOp op, double buffer_bytes, const GroupPlacement& group,
                          CollectiveAlgorithm* chosen = nullptr);
double collective_seconds_with(CollectiveOp op, double buffer_bytes, const GroupPlacement& group,
                               CollectiveAlgorithm algorithm);

enum class P2pPath { P2pPath_intra_node, P2pPath_network, P2pPath_host_staged };
const char* p2p_path_name(P2pPath path);

// A stage boundary: `lanes` device pairs move one hidden-state tensor in parallel.
struct BoundaryLink {
  P2pPath path = P2pPath::P2pPath_network;
  int lanes = 1;
  Link intra_node;                        // when both stages share one node
  Link network;
  double aggregate_network_bytes_per_second = 0;  // nodes on the narrower side x per-node bandwidth
  double host_link_from_bytes_per_second = 0;     // host-staged only
  double host_link_to_bytes_per_second = 0;
  double extra_seconds = 0;  // per transfer, beyond the link (the sender's calibrated profile)
};

double boundary_seconds(double bytes, const BoundaryLink& link);

// Replaces `link`'s intra-node and network links with the sending type's measured transfers and
// sets its calibrated extra time per transfer, where `profile` (may be null) has them. Call it
// before deriving the aggregate network bandwidth from `link->network`.
void boundary_link_apply_profile(BoundaryLink* link, const Profile* profile, const std::string& sender_type);

}  // namespace alloy
