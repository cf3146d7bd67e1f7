// Data-parallel collectives as the simulator replays them: a reduction or gather priced alone on
// its links (its dp part over dp, an expert-parallel stage's routed experts over expert-dp), and
// the block-by-block gathers of a ZeRO-3 pass.
#pragma once

#include <cstddef>
#include <vector>

#include "cost/profile.hpp"
#include "plan/plan.hpp"
#include "plan/schedule.hpp"
#include "sim/shared_links.hpp"
#include "spec/cluster.hpp"
#include "spec/model.hpp"

namespace alloy {

struct SimCollective {
  double seconds = 0;
  bool intra_node = false;  // a part runs on the fabric inside a node
  bool network = false;     // a part crosses nodes
  std::vector<SharedLinkShare> links;  // rack uplinks and WAN ports crossed, each once
};

// Collective `op` of member `dp_rank` (on device `device_id`) of `stage`, alone: `op.bytes` over
// the stage's dp group, then `op.expert_bytes` over the member's expert-dp group; measured
// collectives from `profile` (may be null) where it has the group.
SimCollective sim_collective(const Plan& plan, const ClusterSpec& cluster, const Profile* profile, SimLinkDemands* demands,
                             int stage, int dp_rank, int device_id, const ScheduleOp& op);

// ZeRO 3 (Zero3Parameters): the block a pass gathers alone, the first it uses from device
// memory: the first block of the next forward after op `gather` of `rs`, the last of the next
// backward. Offloaded blocks (`stage`'s, the first of its blocks) prefetch nothing, so a forward
// that opens on them gathers its first resident block alone when it gets there, unless the
// embedding opens the pass (it prefetches that block, riding with the pass's first block).
int sim_zero3_first_block(const RankSchedule& rs, size_t gather, const PlanStage& stage);
// The gather of blocks [begin, end) of `pass`'s stage that member `dp_rank` runs, offloaded
// blocks left out (their weights come whole from host memory).
ScheduleOp sim_zero3_gather_op(const Plan& plan, const ModelSpec& model, int stage, int dp_rank, const ScheduleOp& pass,
                               int begin, int end);

}  // namespace alloy
