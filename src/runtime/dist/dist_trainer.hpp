// `mpirun -np N alloy train --plan plan.json`: every rank runs its part of the plan for the
// training steps, with agreement on bad input before any work, per-rank checkpoints, a JSON-lines
// log, predicted against measured time and memory, a Chrome trace of the real run and the
// gathered full weights.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cost/profile.hpp"
#include "plan/plan.hpp"
#include "runtime/dist/communicator.hpp"
#include "runtime/dist/executor.hpp"
#include "spec/cluster.hpp"
#include "spec/error.hpp"
#include "spec/model.hpp"
#include "spec/train.hpp"

namespace alloy {

// An error every rank found (or was told of) at the same point: each rank reports it and exits
// normally, instead of aborting the job.
class AgreedError : public Error {
 public:
  using Error::Error;
};

struct DistTrainOptions {
  std::string plan_path;         // for messages and the checkpoint's copy
  std::string train_data;        // llm.c token file (read by the first and last stage)
  std::string checkpoint_dir;    // empty: none; else one folder per rank inside
  int64_t checkpoint_every = 0;  // 0: only at the end
  bool resume = false;
  std::string log_path;          // JSON lines from rank 0
  std::string trace_path;        // Chrome trace of the last step, all ranks
  std::string export_path;       // full weights (safetensors, single-rank names) from rank 0
  int threads = 0;
  double memory_cap_bytes = 0;   // per rank; 0: the stage's device memory
  bool progress = true;
};

// One rank's figures over the run (medians of the steps after the first).
struct RankSummary {
  int rank = 0;
  int stage = 0;
  int tp_rank = 0;
  int dp_rank = 0;
  double step_seconds = 0;
  double compute_seconds = 0;
  double wait_seconds = 0;
  double communication_seconds = 0;
  double pass_seconds = 0;       // forward and backward ops of the step
  // Thread CPU seconds of the step's passes in each LayerKind (where the pass time went).
  std::array<double, kLayerKinds> layer_cpu_seconds = {0, 0, 0};
  double optimizer_seconds = 0;
  double peak_arena_bytes = 0;
};

struct DistStepReport {
  int64_t step = 0;
  double loss = 0;
  double learning_rate = 0;
  double grad_norm = 0;
  double step_seconds = 0;  // slowest rank
  double tokens_per_second = 0;
  double peak_arena_bytes = 0;  // largest of any rank
};

// Which of a rank's groups a collective ran on.
enum class CollectiveGroup {
  CollectiveGroup_world,
  CollectiveGroup_tensor,
  CollectiveGroup_data,
  CollectiveGroup_embedding
};

// One timed collective (steps 2 to 1 + kTimedCollectiveSteps), as its members timed it: its own
// seconds once every member had joined (the least of the members' call-to-completion times),
// and whether every member waited for it from its call (CollectiveTiming::blocked).
struct JoinedCollective {
  CollectiveOp op = CollectiveOp::CollectiveOp_all_reduce;
  CollectiveGroup group = CollectiveGroup::CollectiveGroup_world;
  int group_size = 0;
  bool spans_nodes = false;  // its members' devices are on more than one node of the cluster
  int64_t bytes = 0;
  double seconds = 0;
  std::vector<int> ranks;  // its members
  bool blocked = false;
};

struct DistTrainResult {
  int64_t first_step = 0;
  std::vector<DistStepReport> steps;
  std::vector<RankSummary> ranks;  // every rank, on every rank
  std::vector<JoinedCollective> collectives;  // on rank 0 only
  int64_t collective_steps = 0;               // steps whose collectives were timed
};

// Collectives are timed over this many steps after the first (which warms caches and
// allocators): enough for calibration, and a bounded record on long runs.
inline constexpr int64_t kTimedCollectiveSteps = 16;

// Runs on every rank. Errors found before training (world size, plan, data, checkpoints) are
// agreed on so every rank throws the same alloy::Error naming the rank at fault.
DistTrainResult dist_train_run(const ModelSpec& model, TrainSpec train, const Plan& plan, const ClusterSpec& cluster,
                               Communicator& comm, const DistTrainOptions& options);

// Every rank calls it with its own problem ("" for none); throws the first rank's problem as an
// AgreedError on every rank ("rank R of N: ..."), or returns when all are fine.
void dist_agree(Communicator& comm, const std::string& problem);
// Runs `check` on every rank and agrees on the alloy::Errors it throws.
void dist_agree_on(Communicator& comm, const std::function<void()>& check);

// The plan's per-device memory that a rank's arena holds: all terms but the accelerator
// framework's context, the communication library's buffers, the allocator's margin and host memory.
double dist_predicted_arena_bytes(const std::vector<MemoryTerm>& memory);

// Rank 0's table: predicted against measured step time and memory, per rank.
std::string dist_render_summary(const DistTrainResult& result, const Plan& plan);
// The run's step time: the slowest rank's median step after the first.
double dist_measured_step_seconds(const DistTrainResult& result);

// The rank's last-step intervals gathered on rank 0 and written as a Chrome trace in the
// simulator's format. Collective.
void dist_save_trace(RankRuntime& runtime, const Plan& plan, Communicator& comm, const std::string& path);
// The full model gathered on rank 0 and written as safetensors with single-rank names. Collective.
void dist_export_weights(RankRuntime& runtime, const Plan& plan, Communicator& comm, const std::string& path);

}  // namespace alloy
