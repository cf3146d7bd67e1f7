// Per-stage choices inside the planner: for a stage position and a number of blocks, the
// Pareto set of (time per micro-batch, per-step overhead) over ZeRO stage, sequence
// parallelism, recomputation and offload counts that fit the device's memory.
#pragma once

#include <vector>

#include "cost/cost_model.hpp"

namespace alloy {

// A stage position inside one candidate layout.
struct StageSlot {
  StageShape shape;
  const StageUnitCosts* unit[2] = {nullptr, nullptr};  // by sequence parallelism; null: not allowed
  double in_flight = 1;
  bool has_next = false;          // the pipeline has more than one stage
  double boundary_seconds = 0;    // one send to the next stage
  int chunks_sent = 0;
  bool has_embedding = false;
  bool has_head = false;
  bool head_holds_lm_matrix = true;
  double capacity_bytes = 0;
};

struct StageOption {
  double t = 0;  // forward + backward per micro-batch
  double u = 0;  // per-step overhead (exposed gradient sync, optimizer)
  int zero = 0;
  bool sequence_parallel = false;
  int selective = 0;
  int full = 0;
  int offloaded = 0;
};

struct OptionPins {
  int zero = -1;             // -1: free
  int sequence_parallel = -1;  // -1: free, 0/1 pinned
  int recompute = -1;        // -1: free, else a Recompute value for every block
  bool allow_offload = true;
};

StageChoice stage_choice_of(const StageSlot& slot, const StageOption& option, int blocks);

// Fills `out` with the Pareto-optimal options (t ascending, u strictly descending); empty when
// nothing fits. Exact over the counts: blocks are identical, so counts define cost and memory.
void stage_options(const CostModel& cost, const StageSlot& slot, int blocks, const OptionPins& pins,
                   std::vector<StageOption>* out);

// Memory of the most frugal choice for `blocks` blocks (for infeasibility reports).
double stage_min_memory_bytes(const CostModel& cost, const StageSlot& slot, int blocks, const OptionPins& pins);

}  // namespace alloy
