// The uses of a lane's offloaded blocks in a step, as the runtime's offload engine makes them
// (runtime/offload.hpp): one per block and pass, in the order the passes run, each fetched from
// host memory into a slot and, after a backward, its gradients written back.
#pragma once

#include <cstdint>
#include <vector>

#include "plan/plan.hpp"
#include "plan/schedule.hpp"
#include "spec/model.hpp"

namespace alloy {

struct SimOffloadUse {
  int op_index = 0;   // the forward or backward op of the lane's schedule that computes the block
  int block = 0;
  bool backward = false;
  int64_t fetch_bytes = 0;       // weights; a backward that is not the block's first of the step also its summed gradients
  int64_t write_back_bytes = 0;  // a backward's gradients; 0 after a forward
  int previous_backward = -1;    // the use of the block's previous backward in the step (its write-back lands first)
};

// Forward ops visit their blocks ascending, backward ops descending; only the stage's `offload`
// blocks count. Weights at the plan's precision, gradients at its gradient_bytes.
std::vector<SimOffloadUse> sim_offload_uses(const Plan& plan, const ModelSpec& model, const RankSchedule& rs);

// Weights of the offloaded blocks among [begin, end) of `stage` on member `dp_rank`, at the plan's
// precision: what the schedule's prefetch of such a pass holds besides parked activations.
int64_t sim_offloaded_weight_bytes(const Plan& plan, const ModelSpec& model, int stage, int dp_rank, int begin, int end);

// How many uses the engine keeps in device slots at once: one being computed and `depth` fetched
// ahead, no more than the stage's offloaded blocks.
int sim_offload_slots(const PlanStage& st);

}  // namespace alloy
