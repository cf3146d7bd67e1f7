// One rank of a plan: its shard of the model, its communication groups and the executor that
// runs the rank's step schedule (from the schedule generator, unchanged): compute, pipeline
// transfers by sample range, gradient buckets, ZeRO gathers and the sharded optimizer.
#pragma once

#include <array>
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "cost/profile.hpp"
#include "plan/plan.hpp"
#include "plan/schedule.hpp"
#include "runtime/arena.hpp"
#include "runtime/memory_terms.hpp"
#include "runtime/parallel/balance_pool.hpp"
#include "runtime/parallel/communicator.hpp"
#include "runtime/parallel/loss_scaler.hpp"
#include "runtime/parallel/param_layout.hpp"
#include "runtime/parallel/zero3.hpp"
#include "runtime/parallel/zero_gradients.hpp"
#include "runtime/io/checkpoint.hpp"
#include "runtime/io/safetensors.hpp"
#include "runtime/model.hpp"
#include "runtime/cpu_backend.hpp"
#include "runtime/activation_offload.hpp"
#include "runtime/offload.hpp"
#include "plan/timeline.hpp"
#include "spec/train.hpp"

namespace alloy {

class CommTensorParallel;
class CommMoeExchange;

struct RankGroups {
  CommGroup tp;         // same stage and dp rank
  CommGroup dp;         // same stage and tp rank
  CommGroup embedding;  // tied embeddings over a pipeline: first and last stage, same tp rank
  CommGroup ep;         // MoE models: expert-parallel group (plan_ep_group), splits the routed experts
  CommGroup expert_dp;  // MoE models: the same experts' replicas (plan_expert_dp_group), sum their gradients
  CommGroup balance;    // MoE models with the pooled load-balancing loss: every rank of the plan
};

// Per step and rank: where the time went, and memory.
struct RankStepStats {
  double step_seconds = 0;
  double compute_seconds = 0;        // forward, backward, optimizer (slow-device stretch included)
  double wait_seconds = 0;           // blocked on receives, collectives and tensor-parallel sums
  double communication_seconds = 0; // transfers in flight (overlapping compute or not)
  double pass_seconds = 0;           // forward and backward ops, their tensor-parallel sums included
  std::array<double, kLayerKinds> layer_cpu_seconds = {0, 0, 0};  // of the passes, by LayerKind
  double optimizer_seconds = 0;      // the optimizer op without its collective waits
  double loss_sum = 0;               // sum of token losses this rank reports (head stage, tp rank 0)
  double loss_tokens = 0;
  // MoE models: the load-balancing loss this rank reports (tp rank 0), summed as its share of each
  // micro-batch's loss times the tokens (PassLossSums::balance); over loss_tokens of all ranks, the
  // step's mean.
  double aux_loss_sum = 0;
  double grad_norm = 0;
  double learning_rate = 0;
  int64_t peak_arena_bytes = 0;
  MemoryTermBytes peak_term_bytes = {};  // what the arena held at that peak, by term (sums to it)
  // The host arena's peak: offloaded blocks' weights, gradients and moments, and parked
  // activations (0 without offload).
  int64_t peak_host_arena_bytes = 0;
  // Agreed by every rank: some rank's loss, or gradient, held NaN or Inf, so no rank updated its
  // weights this step (they stay as they were; the learning-rate schedule still advances).
  bool loss_finite = true;
  bool update_skipped = false;
  // Dynamic loss scaling: the scale this step's backward ran with, and whether its gradients
  // overflowed (the update skipped and the scale halved: expected now and then, not a bad step).
  double loss_scale = 1;
  bool loss_scale_overflow = false;
  int32_t stop_signal = 0;           // a stop signal this rank received (stop_signals.hpp); 0: none
};

// Makes the backend of a rank's stage (stage_backend_cpu, or the CUDA backend's).
using StageBackendFactory = std::function<std::unique_ptr<StageBackend>(const StageRequest&)>;

// What one rank's device offers the runtime.
struct RankResources {
  StageBackendFactory backend;             // empty: the CPU backend
  int64_t memory_cap_bytes = 0;            // the device arena's capacity
  double slowdown = 1.0;                   // >= 1 stretches compute to emulate a slower device
  double host_memory_bytes = 0;            // this rank's share of its node's host memory
  double host_link_bytes_per_second = 0;   // offload copies, per direction (<= 0: unpaced)
};

// Where the AdamW moments of a range of the packed optimizer ranges live.
struct MomentSegment {
  int64_t packed_offset = 0;
  int64_t count = 0;
  float* m = nullptr;  // (count)
  float* v = nullptr;
  bool on_host = false;  // an offloaded block's, in host memory
};

class RankRuntime {
 public:
  // Builds the shard, groups and layout of `rank`; every rank of the world must call it (group
  // creation is collective). `comm` moves the backend's tensors; `control` (default: comm)
  // carries host values such as the gradient norm's partial sums.
  RankRuntime(const Plan& plan, const ModelSpec& model, const TrainSpec& train, Communicator& comm,
              const RankResources& resources, Communicator* control = nullptr);
  ~RankRuntime();

  // Runs one optimizer step on the global batch inputs, targets: (global_batch, T) token ids
  // (only stages with the embedding or head read them). Records the step's intervals.
  RankStepStats step(const int32_t* inputs, const int32_t* targets);

  // Sum of the token losses (cross-entropy) of this replica's share of every micro-batch of a
  // global batch inputs, targets: (global_batch, T), forward only (validation). The rank must hold the whole
  // model (one stage, tp 1); every replica runs as many passes as in training.
  double loss_sum(const int32_t* inputs, const int32_t* targets);

  StageBackend& backend() { return *backend_; }
  Model& model() { return backend_->model(); }
  const RankSchedule& schedule() const { return schedule_; }
  const ParamLayout& layout() const { return layout_; }
  const RankGroups& groups() const { return groups_; }
  Arena& arena() { return backend_->arena(); }
  // Writes this rank's parameters and AdamW moments to `dir` (checkpoint_save), read through
  // the backend's copies to host memory. Parameters: the model's tensors by name, or under
  // ZeRO 3 this member's packed pieces of the device's ("zero3.pieces") and the offloaded
  // blocks' tensors by name. Moments: per tensor
  // ("adamw.m.<name>") when this rank updates all of its parameters in one place, else packed
  // like the optimizer ranges ("adamw.m"), one pair per place ("adamw.m@<offset>") when
  // offloaded blocks keep theirs in host memory. Returns what checkpoint_save wrote.
  CheckpointFileRecords checkpoint_save_to(const std::string& dir, const CheckpointState& state,
                                           const CheckpointSaveOptions& options = {});
  // Loads what checkpoint_save_to wrote and sets the optimizer's step; returns the state.
  CheckpointState checkpoint_load_from(const std::string& dir, const std::string& fingerprint);
  // Loads step `step` of a checkpoint written under another layout (rank_dirs: every writing
  // rank's folder of the step), reading from the files of the writers that hold them the slices
  // of the full tensors this rank holds (reshard.hpp; verify(r) checks writer r's files before
  // the first read), and sets the optimizer's step.
  void checkpoint_reshard_from(const std::vector<std::string>& rank_dirs, const std::function<void(int)>& verify,
                               int64_t step);
  int64_t optimizer_steps() const { return optimizer_steps_; }
  const LossScaler& loss_scaler() const { return loss_scaler_; }
  // A resumed run's scale and good-step count (a checkpoint's); ignored when scaling is off.
  void loss_scaler_restore(double scale, int64_t good_steps);
  // The first tensor of this rank, in model order, whose gradient (its pieces, when sharded)
  // holds NaN or Inf, as "<name>'s gradient"; "" when all are finite. Read after a step whose update was skipped.
  std::string gradient_nonfinite_name();
  // Collective over the world: throws NonFiniteError on every rank when any rank's parameters
  // (and, with `with_moments`, AdamW moments) hold NaN or Inf, naming the first such tensor and
  // its rank, before `action` (e.g. "save a checkpoint") writes `file`.
  void state_check_finite(const std::string& action, const std::string& file, bool with_moments);
  // Sum of the squares of the gradients this rank counts in the global norm (layout().norm_ranges).
  double gradient_square_sum();
  // Test hook (ALLOY_FAULT=nan:R:S): the next step writes a NaN into the first gradient this rank
  // counts in the norm, after the gradients' sums and before the finiteness check.
  void gradient_poison_next_step() { poison_gradient_ = true; }
  // Every parameter of the rank's shard in model order (num_parameters), in host memory,
  // gathered from the data-parallel members' pieces where ZeRO shards them. Collective over dp.
  std::vector<float> full_parameters();
  // Intervals of the last step, seconds from its start, lane 0 (this rank).
  const std::vector<SimInterval>& intervals() const { return intervals_; }
  const std::vector<MemorySample>& memory_samples() const { return memory_; }
  // Wall-clock seconds (since the epoch) when the last step started: aligns ranks' traces.
  double step_start_seconds() const { return step_start_; }

 private:
  struct PassSlot;
  struct UpdateSpan {  // one AdamW update: flat parameters [offset, offset + count)
    int64_t offset = 0;
    int64_t count = 0;
    int64_t packed = 0;  // where they start in the packed optimizer ranges
    bool decay = false;
  };
  std::vector<UpdateSpan> update_spans() const;
  PassSlot& pass_for(const ScheduleOp& op, const int32_t* inputs, const int32_t* targets);
  void run_op(size_t index, const ScheduleOp& op, const int32_t* inputs, const int32_t* targets, RankStepStats& stats);
  void optimizer(RankStepStats& stats);
  // ZeRO 3 with offload: starts the all-gathers of the offloaded blocks' updated pieces in host
  // memory (waited for at the end of the step, before the next step's first fetch).
  void gather_offloaded_parameters();
  // Flat gradients [offset, offset + count) where this rank keeps them: the backend's buffer, or
  // (sharded gradients) the shard, where the range must be inside one of its pieces.
  float* gradients_at(int64_t offset, int64_t count);
  // The parts of `range` this rank keeps gradients of: all of it, or its pieces when sharded.
  std::vector<FlatRange> gradient_pieces(const FlatRange& range) const;
  void gradient_poison();
  void sum_sequence_parallel_norms(RankStepStats& stats);
  void sum_tied_embedding(RankStepStats& stats);
  void sum_expert_gradients(RankStepStats& stats);
  // The group a bucket's gradients are reduced and its ZeRO pieces gathered over: expert-dp for
  // the routed experts' buckets, else dp.
  const CommGroup& bucket_group(const GradientBucket& bucket) const;
  void wait(const CommHandle& handle, RankStepStats& stats);
  void record(SimStream stream, const ScheduleOp& op, size_t index, double start, double end);
  void reap_finished_passes(bool wait_all, RankStepStats& stats);
  // Transfers and collectives are recorded for the trace from posting until seen complete.
  CommHandle track(CommHandle handle, SimStream stream, const ScheduleOp& op, size_t index);
  void record_completed(bool all);
  int64_t replica_begin(int micro_batch) const;
  int gradient_sends(int micro_batch, int chunk) const;  // send_gradient ops of the pass
  double now() const;
  void build_moments();
  // Host-memory views of the checkpointed tensors: the tensors themselves on a host backend,
  // else copies in `staging` (filled from the backend when `download`).
  std::vector<TensorRef> host_refs(const std::vector<TensorRef>& refs, std::vector<std::vector<float>>& staging,
                                   bool download);
  std::vector<TensorRef> parameter_refs();
  std::vector<TensorRef> optimizer_refs();
  // Copies loaded host views back into the backend's tensors (when its memory is not the
  // host's) and sets the optimizer's step.
  void checkpoint_loaded(const std::vector<TensorRef>& parameters, const std::vector<TensorRef>& host_parameters,
                         const std::vector<TensorRef>& moments, const std::vector<TensorRef>& host_moments, int64_t step);
  const MomentSegment& moments_at(int64_t packed) const;
  void record_offload_copies();

  const Plan& plan_;
  TrainSpec train_;
  Communicator& comm_;
  Communicator& control_;
  RankSchedule schedule_;
  RankGroups groups_;
  // The same groups on control_ for host values (the MoE blocks' sums and counts), when control_
  // is not comm (a GPU communicator moves device memory only); else a copy of groups_.
  RankGroups control_groups_;
  std::unique_ptr<Arena> host_arena_;       // offloaded blocks' parameters, gradients and moments
  std::unique_ptr<CommTensorParallel> tp_ops_;
  std::unique_ptr<CommMoeExchange> moe_exchange_;  // MoE models with dp > 1
  std::unique_ptr<BalancePool> balance_pool_;      // MoE models with the pooled load-balancing loss
  std::unique_ptr<StageBackend> backend_;
  std::array<double, kLayerKinds> layer_cpu_seconds_ = {0, 0, 0};  // this step's passes, by LayerKind
  ParamLayout layout_;
  std::unique_ptr<Zero3Parameters> zero3_;  // ZeRO 3 with dp > 1
  std::unique_ptr<ShardedGradients> sharded_;  // PlanStage::gradients_sharded()
  std::unique_ptr<HostLink> host_link_;     // when the stage offloads weights or activations
  std::unique_ptr<LayerOffload> offload_;   // when the stage offloads blocks' weights
  std::unique_ptr<ParameterSource> both_sources_;  // ZeRO 3 with offload: the model's parameter source
  std::unique_ptr<ActivationOffload> activation_offload_;  // when it offloads saved activations
  std::vector<MomentSegment> moments_;
  std::vector<UpdateSpan> spans_;           // the optimizer's updates (ascending packed offsets), built at its first step
  int64_t optimizer_steps_ = 0;
  LossScaler loss_scaler_;
  bool poison_gradient_ = false;
  double slowdown_ = 1.0;
  std::vector<std::unique_ptr<PassSlot>> passes_;
  std::map<std::pair<int, int>, int> gradient_sends_;  // (micro-batch, chunk) -> send_gradient ops
  std::vector<CommHandle> pending_reductions_;
  std::vector<CommHandle> pending_gathers_;
  struct InFlight {
    CommHandle handle;
    SimStream stream;
    ScheduleOp op;
    size_t index;
    double start;
  };
  std::vector<InFlight> in_flight_;
  std::vector<SimInterval> intervals_;
  std::vector<MemorySample> memory_;
  double step_start_ = 0;
};

// The parameters a rank of `stage` at tensor-parallel position `tp_rank` and data-parallel
// position `dp_rank` holds (the latter picks its routed experts under expert parallelism).
ModelShard rank_shard(const Plan& plan, int stage, int tp_rank, int dp_rank = 0);

// Groups of every rank of the plan, built collectively (each rank gets its own).
RankGroups rank_groups_build(const Plan& plan, const ModelSpec& model, Communicator& comm);

}  // namespace alloy
