// Checks around the search: pinned options against the specs before it starts, notes on pins
// the chosen plan could not apply everywhere, and the error raised when nothing fits because
// host memory cannot hold the offload it needs.
#pragma once

#include <limits>
#include <string>
#include <vector>

#include "search/planner.hpp"

namespace alloy {

// Host memory a structure would need per device to fit device memory by offload.
struct HostShortfall {
  double ratio = std::numeric_limits<double>::infinity();  // of the device's share of host memory
  double bytes_per_device = 0;
  int type = 0;
};

// Throws alloy::Error for pins that contradict each other or the specs.
void search_options_validate(const CostModel& cost, const SearchOptions& options);
// A pinned expert-parallel degree: refused for a dense model, or one that does not divide the
// experts or a pinned dp (alloy::Error, field "ep").
void search_check_expert_parallelism(const ModelSpec& model, const SearchOptions& options);

// A pinned ZeRO stage (1-3) on a stage of the plan with one replica, which has nothing to shard
// over and runs as ZeRO 0: one line per such stage saying so.
std::vector<std::string> zero_pin_notes(const Plan& plan, const SearchOptions& options);

// A predicted MFU above the best published for every device type the plan uses (where the
// catalog knows one): one line saying the prediction is likely optimistic; none otherwise.
std::vector<std::string> published_mfu_notes(const Plan& plan, const CostModel& cost);

// Nothing fits device memory unless more is offloaded than host memory holds: throws
// alloy::Error with the host memory per node needed, what the node has and the fixes.
[[noreturn]] void search_host_memory_fail(const ClusterSpec& cluster, const HostShortfall& need);

}  // namespace alloy
