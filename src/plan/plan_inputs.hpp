// A plan is self-contained: it keeps the model, cluster and training setup it was made for
// (Plan::inputs), so `alloy train --plan P`, `simulate`, `explain` and `report` need nothing
// else. What a user passes anyway must agree with the plan, or is refused naming the flag.
#pragma once

#include <string>

#include "plan/plan.hpp"

namespace alloy {

// Records what `plan` was made for in plan->inputs.
void plan_set_inputs(Plan* plan, const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train);

// The model a run of `plan` (read from `source`) uses: `given` (a preset or a path: it must be
// the plan's architecture), else the plan's own, else, in a plan without inputs, the preset the
// plan names. Throws alloy::Error naming --model when `given` is another model.
ModelSpec plan_model(const Plan& plan, const std::string& given, const std::string& source);

// The same for the cluster (--cluster: it must have the plan's devices and links).
ClusterSpec plan_cluster(const Plan& plan, const std::string& given, const DeviceCatalog& catalog,
                         const std::string& source);

// The training setup: the file `given` (its sequence length and global batch must be the
// plan's), else the plan's own, else the defaults; with plan_train_spec applied.
TrainSpec plan_train(const Plan& plan, const std::string& given, const std::string& source);

}  // namespace alloy
