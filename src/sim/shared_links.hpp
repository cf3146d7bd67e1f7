// The cluster's shared links in the simulation (rack uplinks and WAN ports, each direction):
// what a stage's boundary sends and data-parallel collectives ask of them, and how busy each
// link was over the step. Clusters without racks and sites have none.
#pragma once

#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "cost/comm.hpp"
#include "plan/plan.hpp"
#include "plan/timeline.hpp"
#include "spec/cluster.hpp"
#include "spec/topology.hpp"

namespace alloy {

class SimLinkDemands {
 public:
  SimLinkDemands(const Plan& plan, const ClusterSpec& cluster);

  const std::vector<SharedLink>& links() const { return shared_.links; }

  // One send of stage `from`'s representative to stage `to`: it stands for one piece sent by
  // each of the stage's ranks at once, over the boundary's lanes (network_boundary_hops), each
  // lane at `lane_bytes_per_second`.
  std::vector<SharedLinkShare> boundary(int from, int to, double lane_bytes_per_second);

  // A data-parallel collective of `stage` (every tp rank's ring at once) by `algorithm`;
  // `group`: the stage's network_dp_group, or with `experts` the expert-dp group of its first
  // member (plan_stage_expert_dp_ids).
  std::vector<SharedLinkShare> collective(int stage, const GroupPlacement& group, CollectiveAlgorithm algorithm,
                                          bool experts = false);

 private:
  // Per shared link a set of hops crosses: (link id, hops crossing it).
  using Crossings = std::vector<std::pair<int, int>>;
  Crossings crossings(const std::vector<TopologyHop>& hops) const;
  std::vector<SharedLinkShare> shares(const Crossings& crossings, double hop_bytes_per_second, double scale) const;

  const Plan& plan_;
  const ClusterSpec& cluster_;
  TopologySharedLinks shared_;
  std::map<std::pair<int, int>, Crossings> boundary_crossings_;    // (from stage, to stage)
  std::map<std::tuple<int, int, bool>, Crossings> collective_crossings_;  // (stage, algorithm, experts)
};

// Per link: the time anything crossed it, and the time its transfers together asked for more
// than it carries (and so ran slower than alone). `spans`: per link, the transfers on it.
std::vector<SimSharedLink> sim_shared_link_usage(const std::vector<SharedLink>& links,
                                                 const std::vector<std::vector<LinkSpan>>& spans);

}  // namespace alloy
