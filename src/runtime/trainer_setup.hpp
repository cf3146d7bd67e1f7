// What the training loop settles before and after its steps: the checks of a plan against what
// the run can do, the layout a checkpoint was written under, the per-rank summary and the fault
// hook the tests end ranks with.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/plan.hpp"
#include "plan/schedule.hpp"
#include "runtime/parallel/executor.hpp"
#include "runtime/trainer.hpp"
#include "spec/cluster.hpp"
#include "spec/model.hpp"

namespace alloy {

// What the run cannot do with this plan whatever the backend: tensor-parallel splits the model
// does not divide, offloaded state beyond each device's share of host memory, validation
// without the whole model on every rank. Throws alloy::Error naming the plan field.
void trainer_check_plan(const Plan& plan, const ModelSpec& model, const ClusterSpec& cluster, const TrainerOptions& options);

// Identifies the layout a checkpoint was written under: stages, shapes, batches, schedule.
std::string plan_layout_fingerprint(const Plan& plan);

// Medians of a rank's steps after the first (which warms caches and allocators).
RankSummary trainer_summarise(const std::vector<RankStepStats>& steps, const RankSchedule& schedule);

// The optimizer's numbers and the run's tolerance of bad steps: NaN, Inf or out of range is
// refused before any allocation, naming the flag or training-setup field.
void trainer_check_numbers(const TrainSpec& train, const TrainerOptions& options);

// Test hook: ALLOY_FAULT=kill:R:S, throw:R:S or stall:R:S makes rank R kill itself (SIGKILL),
// throw an error or sleep at the start of step S, to check that the whole job ends promptly with
// a clear message; term:R:S makes rank R send itself SIGTERM at the start of step S (a stop
// request); nan:R:S returns true on rank R at step S, for the caller to poison that step's
// gradient.
bool trainer_inject_fault(int rank, int64_t step);
// Test hook: ALLOY_FAULT=killsave:R:S makes rank R kill itself (SIGKILL) in the middle of writing
// its checkpoint of step S, after the weights and before the optimizer state; failsave:R:S makes
// that write fail there instead (as from a full disk).
void trainer_inject_save_fault(int rank, int64_t step);

}  // namespace alloy
