// What a run hands back to people beyond its steps: the predicted-against-measured table per
// rank, the Chrome trace of the real step and the full weights gathered from every rank's shard.
#pragma once

#include <string>
#include <vector>

#include "plan/plan.hpp"
#include "runtime/parallel/communicator.hpp"
#include "runtime/parallel/executor.hpp"
#include "runtime/trainer.hpp"

namespace alloy {

// The plan's per-device memory that a rank's arena holds: all terms but the accelerator
// framework's context, the communication library's buffers, the allocator's margin and host memory
// (the sum of memory_terms_predicted).
double dist_predicted_arena_bytes(const std::vector<MemoryTerm>& memory);

// The plan's per-device host memory (its host_offload term: offloaded blocks' state and parked
// activations), which a rank's host arena holds.
double dist_predicted_host_bytes(const std::vector<MemoryTerm>& memory);

// Rank 0's tables: predicted against measured step time and memory per rank, then the arena's
// peak by term against the prediction by term (a row pair per rank; per stage beyond 8 ranks),
// and where the plan offloads, each offloading rank's host arena peak against its prediction.
std::string dist_render_summary(const TrainerResult& result, const Plan& plan);
// The run's step time: the slowest rank's median step after the first.
double dist_measured_step_seconds(const TrainerResult& result);

// The rank's last-step intervals gathered on rank 0 and written as a Chrome trace in the
// simulator's format. Collective.
void dist_save_trace(RankRuntime& runtime, const Plan& plan, Communicator& comm, const std::string& path);
// The full model gathered on rank 0 and written as safetensors with single-rank names. Collective.
void dist_export_weights(RankRuntime& runtime, const Plan& plan, Communicator& comm, const std::string& path);

}  // namespace alloy
