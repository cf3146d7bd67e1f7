// The event simulator: replays a plan's step schedule on its devices, with compute, transfer,
// collective and host-copy streams, links shared by the transfers that cross them, and memory
// allocated and freed as operations run. Identical data-parallel replicas are simulated once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cost/profile.hpp"
#include "plan/plan.hpp"
#include "plan/schedule.hpp"
#include "plan/timeline.hpp"
#include "spec/cluster.hpp"
#include "spec/model.hpp"

namespace alloy {

struct SimOptions {
  ScheduleOptions schedule;  // its bucket_bytes is the plan's gradient_bucket_bytes
  bool record_intervals = true;  // every operation's time span, for traces and reports
  // Measured collectives (not owned; may be null): where it has a stage's group, its times
  // replace the alpha-beta model, as they do in the cost model the plan was priced with.
  const Profile* profile = nullptr;
};

// Throws alloy::Error when the plan is invalid or made for another model or cluster
// (fingerprints, when the plan has them, and the device count).
SimResult simulate(const Plan& plan, const ModelSpec& model, const ClusterSpec& cluster,
                   const SimOptions& options = {});

// Throws alloy::Error naming the stage (field stages[s].memory) whose simulated peak exceeds
// its device's capacity, e.g. for a hand-edited plan; plans without capacities pass.
void sim_check_memory(const SimResult& result, const Plan& plan);

// Aligned tables for people: per stage busy, bubble, communication and peak memory; per shared
// link (rack uplink, WAN port) its busy and contended time.
std::string sim_render_text(const SimResult& result, const Plan& plan);

}  // namespace alloy
