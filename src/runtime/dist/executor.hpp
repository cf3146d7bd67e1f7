// One rank of a plan: its shard of the model, its communication groups and the executor that
// runs the rank's step schedule (from the schedule generator, unchanged): compute, pipeline
// transfers by sample range, gradient buckets, ZeRO gathers and the sharded optimizer.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "cost/profile.hpp"
#include "plan/plan.hpp"
#include "plan/schedule.hpp"
#include "runtime/arena.hpp"
#include "runtime/dist/communicator.hpp"
#include "runtime/dist/param_layout.hpp"
#include "runtime/dist/zero3.hpp"
#include "runtime/io/safetensors.hpp"
#include "runtime/model.hpp"
#include "runtime/activation_offload.hpp"
#include "runtime/offload.hpp"
#include "sim/simulate.hpp"
#include "spec/train.hpp"

namespace alloy {

class CommTensorParallel;

struct RankGroups {
  CommGroup tp;         // same stage and dp rank
  CommGroup dp;         // same stage and tp rank
  CommGroup embedding;  // tied embeddings over a pipeline: first and last stage, same tp rank
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
  double grad_norm = 0;
  double learning_rate = 0;
  int64_t peak_arena_bytes = 0;
};

// What one rank's device offers the runtime.
struct RankResources {
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
  // creation is collective).
  RankRuntime(const Plan& plan, const ModelSpec& model, const TrainSpec& train, Communicator& comm,
              const RankResources& resources);
  ~RankRuntime();

  // Runs one optimizer step on the global batch inputs, targets: (global_batch, T) token ids
  // (only stages with the embedding or head read them). Records the step's intervals.
  RankStepStats step(const int32_t* inputs, const int32_t* targets);

  Model& model() { return *model_; }
  const RankSchedule& schedule() const { return schedule_; }
  const ParamLayout& layout() const { return layout_; }
  const RankGroups& groups() const { return groups_; }
  Arena& arena() { return *arena_; }
  // Checkpoint views of the AdamW moments of optimizer_ranges, packed: "adamw.m" and "adamw.v"
  // ((layout().optimizer_floats()) each), or one pair per place ("adamw.m@<offset>") when
  // offloaded blocks keep theirs in host memory.
  std::vector<TensorRef> optimizer_refs();
  int64_t& optimizer_steps() { return optimizer_steps_; }
  // Every parameter of the rank's shard in model order (num_parameters), gathered from the
  // data-parallel members' pieces where ZeRO shards them. Collective over the dp group.
  std::vector<float> full_parameters();
  // What a checkpoint holds for this rank's parameters: the model's tensors, or under ZeRO 3
  // this member's packed pieces.
  std::vector<TensorRef> parameter_refs();
  // Intervals of the last step, seconds from its start, lane 0 (this rank).
  const std::vector<SimInterval>& intervals() const { return intervals_; }
  const std::vector<MemorySample>& memory_samples() const { return memory_; }
  // Wall-clock seconds (since the epoch) when the last step started: aligns ranks' traces.
  double step_start_seconds() const { return step_start_; }

 private:
  struct PassSlot;
  PassSlot& pass_for(const ScheduleOp& op, const int32_t* inputs, const int32_t* targets);
  void run_op(size_t index, const ScheduleOp& op, const int32_t* inputs, const int32_t* targets, RankStepStats& stats);
  void optimizer(RankStepStats& stats);
  void sum_sequence_parallel_norms(RankStepStats& stats);
  void sum_tied_embedding(RankStepStats& stats);
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
  const MomentSegment& moments_at(int64_t packed) const;
  void record_offload_copies();

  const Plan& plan_;
  TrainSpec train_;
  Communicator& comm_;
  RankSchedule schedule_;
  RankGroups groups_;
  std::unique_ptr<Arena> arena_;
  std::unique_ptr<Arena> host_arena_;       // offloaded blocks' parameters, gradients and moments
  std::unique_ptr<CommTensorParallel> tp_ops_;
  std::unique_ptr<Model> model_;
  std::array<double, kLayerKinds> layer_cpu_seconds_ = {0, 0, 0};  // this step's passes, by LayerKind
  ParamLayout layout_;
  std::unique_ptr<Zero3Parameters> zero3_;  // ZeRO 3 with dp > 1
  std::unique_ptr<HostLink> host_link_;     // when the stage offloads weights or activations
  std::unique_ptr<LayerOffload> offload_;   // when the stage offloads blocks' weights
  std::unique_ptr<ActivationOffload> activation_offload_;  // when it offloads saved activations
  std::vector<MomentSegment> moments_;      // ascending packed offsets, covering the optimizer ranges
  int64_t optimizer_steps_ = 0;
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

// The parameters a rank of `stage` at tensor-parallel position `tp_rank` holds.
ModelShard rank_shard(const Plan& plan, int stage, int tp_rank);

// Groups of every rank of the plan, built collectively (each rank gets its own).
RankGroups rank_groups_build(const Plan& plan, const ModelSpec& model, Communicator& comm);

}  // namespace alloy
