// The training loop behind `alloy train`, one for every run: a plan's ranks under mpirun, one
// device without a plan (the one-rank case of the same loop), on CPU or GPU backends. Batches
// from token files, the executor's steps, validation, checkpoints with exact resume, the
// JSON-lines log, progress lines, predicted against measured time and memory, traces and the
// gathered full weights.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cost/profile.hpp"
#include "plan/plan.hpp"
#include "runtime/activation_memory.hpp"
#include "runtime/memory_terms.hpp"
#include "runtime/parallel/communicator.hpp"
#include "runtime/parallel/executor.hpp"
#include "spec/cluster.hpp"
#include "spec/model.hpp"
#include "spec/train.hpp"

namespace alloy {

struct TrainerOptions {
  std::string train_data;            // llm.c token file (read by the stages with the embedding or head)
  std::string val_data;              // optional; validation loss every val_every steps (one-stage plans)
  int64_t batch_size = 0;            // without a plan: sequences per step; 0: the TrainSpec's global batch
  int64_t val_every = 0;             // 0: only at the end (when val_data is given)
  int64_t val_batches = 4;           // batches per validation pass
  std::string checkpoint_dir;        // empty: no checkpoints; else every rank's, committed together
  int64_t checkpoint_every = 0;      // 0: only at the end
  int keep_checkpoints = 2;          // committed checkpoints kept in checkpoint_dir (>= 1)
  bool resume = false;               // continue from checkpoint_dir
  std::string log_path;              // JSON lines, one per step, from rank 0
  std::string plan_path;             // the plan's file, for messages
  std::string trace_path;            // Chrome trace of the last step, all ranks
  std::string export_path;           // full weights (safetensors, single-rank names) from rank 0
  int threads = 0;                   // 0: the cores this rank's share of the host gives it
  Recompute recompute = Recompute::Recompute_none;  // without a plan: for every block
  double memory_cap_bytes = 0;       // per rank; 0: the device's memory
  bool progress = true;              // progress line on stderr (rank 0)
  bool emulate_network = false;      // pace traffic between ranks of different nodes to the cluster's links
  // Steps in a row whose loss or gradient held NaN or Inf (each skipped, the weights kept) that
  // stop the run with NonFiniteError; fewer are skipped with a warning.
  int64_t max_bad_steps = 1;
};

struct StepReport {
  int64_t step = 0;               // 1-based optimizer step just completed
  double loss = 0;                // mean cross-entropy over every token of the step (the LM loss)
  double learning_rate = 0;
  double grad_norm = 0;
  double loss_scale = 1;          // the backward's (dynamic loss scaling; 1 when off)
  bool loss_scale_overflow = false;  // the gradients overflowed: update skipped, scale halved
  double step_seconds = 0;        // the slowest rank's
  double tokens_per_second = 0;
  double mfu = 0;                 // model FLOPs / (step time x the ranks' measured matmul peaks)
  int64_t peak_arena_bytes = 0;   // the largest of any rank
  int64_t peak_host_arena_bytes = 0;  // the largest host arena of any rank (0 without offload)
  std::optional<double> val_loss; // when this step ran a validation pass
  // Mixture-of-Experts models: the step's load-balancing loss, unweighted (the model's form,
  // MoeBalance), averaged over its micro-batches; the objective trained is loss +
  // router_aux_loss_coef x it. And the top-k picks of each expert of each block, (num_layers x
  // experts) row-major, dense blocks 0.
  std::optional<double> aux_loss;
  std::vector<int64_t> expert_tokens;
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
  double peak_arena_bytes = 0;            // the largest of the steps
  MemoryTermBytes peak_term_bytes = {};   // that step's peak by term
  double peak_host_arena_bytes = 0;       // the largest of the steps (0 without offload)
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

struct TrainerResult {
  std::string backend = "cpu";    // the backend the stages ran on
  int64_t first_step = 0;         // 0, or the checkpoint's step when resumed
  std::vector<StepReport> steps;
  std::optional<double> initial_val_loss;
  std::optional<double> final_val_loss;
  double gemm_peak_flops = 0;     // the ranks' measured matmul peaks, summed: the MFU denominator
  int64_t peak_arena_bytes = 0;   // the largest of any rank over the run
  int64_t peak_host_arena_bytes = 0;  // the same for the host arenas (0 without offload)
  std::vector<RankSummary> ranks;  // every rank, on every rank
  std::vector<JoinedCollective> collectives;  // on rank 0 only
  int64_t collective_steps = 0;               // steps whose collectives were timed
  int stop_signal = 0;  // the signal that stopped the run early (after saving its last step); 0: none
};

// Collectives are timed over this many steps after the first (which warms caches and
// allocators): enough for calibration, and a bounded record on long runs.
inline constexpr int64_t kTimedCollectiveSteps = 16;

// Where a run's stages compute.
struct TrainBackend {
  std::string name = "cpu";     // what the plan is checked against (stage_backend_supports)
  StageBackendFactory make;     // empty: the CPU backend
  Communicator* data = nullptr; // moves the backend's tensors (NCCL); nullptr: the run's communicator
};

// Runs the plan's steps on every rank of `comm` (from the checkpoint's step when resuming).
// Errors found before training (world size, plan, backend support, data, checkpoints) are agreed
// on, so every rank throws the same alloy::Error naming the rank at fault; later errors on one
// rank end the job through the communicator. `on_step` sees each report as it is made.
TrainerResult train_run(const ModelSpec& model, TrainSpec train, const Plan& plan, const ClusterSpec& cluster,
                        Communicator& comm, const TrainerOptions& options, const TrainBackend& backend = {},
                        const std::function<void(const StepReport&)>& on_step = {});

// Without a plan: one stage of the whole model on `replicas` devices of type `device` (a CPU
// core when null) on one node, data parallel, with options.batch_size sequences per step (the
// TrainSpec's global batch when 0) in one micro-batch per replica, options.recompute on every block.
struct OneStage {
  Plan plan;
  ClusterSpec cluster;
};
OneStage trainer_one_stage(const ModelSpec& model, const TrainSpec& train, const TrainerOptions& options,
                           const DeviceType* device = nullptr, int replicas = 1);

// `alloy train` without a plan on a CPU core: train_run over trainer_one_stage, in a world of
// one rank. Throws alloy::Error for bad data, checkpoints or memory.
TrainerResult trainer_run(const ModelSpec& model, const TrainSpec& train, const TrainerOptions& options,
                          const std::function<void(const StepReport&)>& on_step = {});

// Identifies a model architecture in checkpoints: name plus a hash of every size and flag.
std::string trainer_model_fingerprint(const ModelSpec& model);

}  // namespace alloy
