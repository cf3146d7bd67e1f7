// The plan's note on a cluster with more than one network: the slowest link the layout crosses
// and what it puts across it (pipeline boundaries, data-parallel reductions), and the links
// measured between node groups that replaced the cluster file's figures.
#pragma once

#include <string>
#include <vector>

#include "plan/plan.hpp"
#include "spec/cluster.hpp"

namespace alloy {

// Empty on a flat cluster (one network), else one line, and one more naming measured links.
std::vector<std::string> network_notes(const Plan& plan, const ClusterSpec& cluster);

}  // namespace alloy
