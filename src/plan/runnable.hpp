// Whether the runtime can run a stage's layout, answered from the model and the layout alone:
// the planner asks it of every layout it enumerates, the runtime of every plan it is given.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/plan.hpp"
#include "spec/model.hpp"

namespace alloy {

// Ok, or the feature of a stage that cannot run, the plan field that asks for it and what would.
struct StageSupport {
  bool ok = true;
  std::string feature;  // e.g. "tensor parallelism (tp 2)"
  std::string field;    // the plan field that asks for it, e.g. "stages[1].tp"
  std::string reason;   // e.g. "the cuda backend runs whole blocks on one device"
};

// One stage's parallel layout, as much as the runtime's checks need of it.
struct StageLayout {
  int stage = 0;                        // names the plan fields in answers
  int tp = 1;
  int dp = 1;
  bool sequence_parallel = false;
  bool offload = false;                 // any block's weights in host memory
  bool shard_gradients = false;         // PlanStage::gradients_sharded
  int most_pieces = 1;                  // the most passes a replica splits its share into
  std::vector<int64_t> replica_tokens;  // tokens of one micro-batch per dp replica (empty: unknown)
};

// Tensor parallelism `tp` of `model`: it must divide the query and key/value heads and the FFN
// width, and the vocabulary must have a row per rank. A refusal's field is the model's.
StageSupport tp_runnable(const ModelSpec& model, int tp);
// The layout's features (no model limits). Weight offload runs at every ZeRO stage with
// gradients accumulated in full (docs/runtime-offload.md).
StageSupport stage_features_runnable(const StageLayout& layout);
// Both: the one answer the planner and the runtime share.
StageSupport stage_layout_runnable(const ModelSpec& model, const StageLayout& layout);

// Stage `stage` of `plan` as a layout.
StageLayout stage_layout_of(const Plan& plan, int stage);

// Every tp in [1, most] (powers of two) that `model` runs with, e.g. "1, 2".
std::string tp_runnable_list(const ModelSpec& model, int most);

}  // namespace alloy
