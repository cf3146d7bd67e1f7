// Plan: the contract between the planner, the simulator and the runtime. Which devices run
// which layers with which parallel shape, and what the cost model predicts for it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "spec/cluster.hpp"
#include "spec/device_type.hpp"
#include "spec/model.hpp"
#include "spec/parallel.hpp"
#include "spec/train.hpp"

namespace alloy {

inline constexpr int kPlanVersion = 1;
// Deepest offload prefetch a plan may ask for (blocks fetched ahead of their use).
inline constexpr int kMaxOffloadPrefetchDepth = 8;

// Decoder blocks [begin, end) of one model chunk.
struct LayerRange {
  int begin = 0;
  int end = 0;
  int size() const { return end - begin; }
};

// One named term of a device's memory (parameters, activations, framework context, ...).
struct MemoryTerm {
  std::string name;
  double bytes = 0;
};

// One data-parallel replica (tp group) of a stage under uneven data parallelism: its devices'
// type, its share of each micro-batch and what the cost model predicts for it.
struct PlanReplica {
  std::string device_type;
  int64_t sequences = 0;          // of each micro-batch
  int pieces = 1;                 // the share runs in this many passes one after another (sizes
                                  // as even as possible, gradients accumulated); single-stage
                                  // plans without ZeRO-3 only
  double forward_seconds = 0;     // per micro-batch
  double backward_seconds = 0;
  double optimizer_seconds = 0;   // per step
  std::vector<MemoryTerm> memory;  // per device
  double memory_capacity_bytes = 0;

  double memory_total_bytes() const;  // on the device (host_offload left out)
  // Sequences of piece k (0 <= k < pieces): the first sequences % pieces pieces take one more.
  int64_t piece_sequences(int k) const;
};

struct PlanStage {
  std::string device_type;        // type name; every device of the stage has this type (under
                                  // uneven data parallelism: replica 0's type)
  std::vector<int> device_ids;    // tp * dp ids, rank order: tp fastest, then dp
  int tp = 1;
  int dp = 1;
  int zero = 0;                   // ZeRO stage 0-3
  // ZeRO 2-3 with dp > 1: every micro-batch's backward reduce-scatters its gradients part by part
  // and the member keeps only its shard (1/dp of the gradients plus the parts in use);
  // false: gradients accumulate in full over the step's micro-batches and are reduce-scattered
  // once, after the last (less communication, full gradient memory).
  bool shard_gradients = false;
  bool sequence_parallel = false;
  // Mixture-of-Experts models: each MoE block's routed experts are split over `ep` data-parallel
  // replicas in a row (dp ranks [g ep, (g + 1) ep) form expert-parallel group g, tokens travel to
  // their experts' member by all-to-all); the dp / ep groups each hold every expert and sum the
  // experts' gradients over the members at one position of every group. 1: every replica holds
  // every expert. Divides dp.
  int ep = 1;
  // Routed experts of each MoE block held by each member of an expert-parallel group, in member
  // order (expert ids follow: member 0 holds the first), summing to the model's experts; more on
  // faster devices balances their tokens. Empty: num_experts / ep each.
  std::vector<int> experts_per_member;
  std::vector<LayerRange> chunks;  // one per virtual chunk (1 unless interleaved)
  bool has_embedding = false;      // first stage
  bool has_head = false;           // last stage (final norm and LM head)
  std::vector<Recompute> recompute;  // per block of the stage, chunks in order
  std::vector<bool> offload;         // per block: weights and optimizer state in host memory
  std::vector<bool> offload_activations;  // per block: its saved activations wait in host memory
                                          // between forward and backward (empty: none)
  int offload_prefetch_depth = 1;    // offloaded blocks fetched ahead of their use (1-8)
  // Uneven data parallelism: one entry per dp replica, dp order; replicas may differ in device
  // type and take unequal shares of each micro-batch (summing to micro_batch_sequences). Empty:
  // every replica is a `device_type` and takes micro_batch_sequences / dp.
  std::vector<PlanReplica> replicas;

  // Predictions of the cost model (under uneven data parallelism: times of the slowest replica,
  // memory of the replica nearest its capacity; each replica's own are in `replicas`).
  double forward_seconds = 0;        // per micro-batch, all chunks
  double backward_seconds = 0;       // per micro-batch, recomputation included
  double gradient_sync_seconds = 0;  // per step, exposed part
  double optimizer_seconds = 0;      // per step
  double offload_exposed_seconds = 0;  // per micro-batch: host copies not hidden (in fwd + bwd)
  // Per micro-batch, the part of offload_exposed_seconds in forward_seconds (the rest is in
  // backward_seconds; the simulator runs the copies as copies of their own).
  double offload_exposed_forward_seconds = 0;
  // Per micro-batch, in forward_seconds and again in backward_seconds: the stage's sends to the
  // next stage (its activations forward, the gradients it waits for backward).
  double boundary_send_seconds = 0;
  // Per micro-batch, ZeRO 3: the gathers the stage's passes wait for before their first block,
  // in forward_seconds and in backward_seconds (the simulator runs them as gathers of their own).
  double first_gather_forward_seconds = 0;
  double first_gather_backward_seconds = 0;
  double micro_batches_in_flight = 0;
  std::vector<MemoryTerm> memory;    // per device
  double memory_capacity_bytes = 0;

  int num_blocks() const;
  // The member keeps only its shard of the gradients (shard_gradients under ZeRO 2-3 with dp > 1).
  bool gradients_sharded() const { return shard_gradients && zero >= 2 && dp > 1; }
  double memory_total_bytes() const;
  // Replica `dp_rank`'s type, share, first sequence inside each micro-batch and predictions,
  // for even and uneven data parallelism alike.
  PlanReplica replica(int64_t micro_batch_sequences, int dp_rank) const;
  int64_t replica_sequences(int64_t micro_batch_sequences, int dp_rank) const;
  int64_t replica_offset(int64_t micro_batch_sequences, int dp_rank) const;
  // Floats [begin, end) of a `count`-float range that replica `dp_rank` holds and updates under
  // ZeRO. Even replicas hold even pieces; under uneven data parallelism each holds a piece in
  // proportion to its share of the micro-batch, so that a device with half the share (a slower
  // one) updates half the weights and every replica's optimizer step takes about as long.
  std::pair<int64_t, int64_t> zero_piece(int64_t micro_batch_sequences, int64_t count, int dp_rank) const;
  // Replica `dp_rank`'s fraction of what ZeRO shards (of zero_piece's floats, in the limit).
  double zero_share(int64_t micro_batch_sequences, int dp_rank) const;
  // Per-block flags of this stage (chunks in order, like `offload`) as flags per model layer,
  // false for layers of other stages and past the end of `per_block`.
  std::vector<bool> layer_flags(const std::vector<bool>& per_block, int64_t num_layers) const;
};

// Whether any of per-block flags (offload, offload_activations) is set.
bool flags_any(const std::vector<bool>& flags);

// A layout that lost, kept to explain the choice.
struct RunnerUp {
  std::string shape;        // e.g. "pp 2 (a100 tp2 dp2 | v100 tp1 dp4), 1f1b, m 16"
  double step_seconds = 0;
  double tokens_per_second = 0;
  std::string reason;       // why it lost, e.g. "v100 stage is the bottleneck: +14%"
};

// What a plan was made for, so that a run needs nothing else: the model in Alloy's YAML format
// (model_to_yaml), the cluster file's text as read, the training setup (train_to_yaml). Empty in
// plans written before they were kept, or by hand.
struct PlanInputs {
  std::string model;
  std::string cluster;
  std::string train;
  bool empty() const { return model.empty() && cluster.empty() && train.empty(); }
};

struct Plan {
  int version = kPlanVersion;
  std::string model_name;
  std::string model_fingerprint;
  int num_layers = 0;
  std::string cluster_name;
  std::string cluster_fingerprint;
  int num_devices = 0;          // devices in the cluster (the plan may use fewer)
  std::string objective = "throughput";
  PlanInputs inputs;

  int64_t seq_len = 0;
  int64_t global_batch_sequences = 0;
  int64_t micro_batch_sequences = 0;   // one micro-batch across all replicas of a stage
  int num_micro_batches = 0;
  Schedule schedule = Schedule::Schedule_1f1b;
  int virtual_chunks = 1;
  double gradient_bucket_bytes = 64.0 * 1024 * 1024;  // TrainSpec::gradient_bucket_mib, in bytes
  // Bytes per gradient element in the reductions the plan was priced with: as the gradients
  // accumulate and all-reduce (4 beside fp32 master weights), and as ZeRO 2-3 reduce-scatters
  // send them (2 under gradient_communication: bf16).
  int gradient_bytes = 4;
  int reduce_scatter_bytes = 4;
  Precision precision = Precision::Precision_bf16;

  std::vector<PlanStage> stages;

  // Predictions for one optimizer step.
  double step_seconds = 0;
  double tokens_per_second = 0;
  double mfu = 0;               // model FLOPs / (step time x summed peak of used devices)
  double hfu = 0;               // counting recomputation
  double bubble_fraction = 0;
  double price_per_million_tokens = 0;  // 0 when the cluster has no prices
  double offload_step_seconds = 0;      // what the exposed host copies add to the step
  double host_offload_bytes_per_node = 0;  // offloaded state on the node that holds the most
  double host_memory_bytes_per_node = 0;   // that node's host memory (0: nothing offloaded)
  std::vector<RunnerUp> runner_ups;
  std::vector<std::string> notes;

  int num_used_devices() const;
};

// Stable hashes of what a plan depends on: the architecture (not the file path), the
// cluster's devices and links.
std::string model_fingerprint(const ModelSpec& model);
std::string cluster_fingerprint(const ClusterSpec& cluster);

// Internal consistency: every layer in exactly one stage, every device at most once, degrees
// that multiply to the stage's devices, batch sizes that divide. Throws alloy::Error naming
// the stage and field; `source` names the file (or "" for a plan built in memory).
void plan_validate(const Plan& plan, const std::string& source = "");
// Also checks the plan against the model and cluster it will run on (fingerprints, device
// types, tp groups inside one node).
void plan_validate_for(const Plan& plan, const ModelSpec& model, const ClusterSpec& cluster,
                       const std::string& source = "");
// Offloaded state per node (each stage's predicted host_offload term, per device) against the
// node's host memory: throws alloy::Error with the need, the capacity and the fixes. Part of
// plan_validate_for; run it again after re-predicting a plan.
void plan_check_host_memory(const Plan& plan, const ClusterSpec& cluster, const std::string& source = "");
// Host memory the plan's offloaded state takes on each node of the cluster (by node index).
std::vector<double> plan_host_offload_bytes_by_node(const Plan& plan, const ClusterSpec& cluster);

std::string plan_to_json(const Plan& plan);
// Parses and validates (plan_validate). Throws alloy::Error naming file and field.
Plan plan_from_json(const std::string& json_text, const std::string& source = "");
Plan plan_load(const std::string& path);
void plan_save(const Plan& plan, const std::string& path);

// Global ranks: stages in pipeline order; inside a stage tp fastest, then dp (Megatron's
// tp-dp-pp order).
struct RankInfo {
  int rank = 0;
  int device_id = 0;
  int stage = 0;
  int tp_rank = 0;
  int dp_rank = 0;
};
std::vector<RankInfo> plan_rank_map(const Plan& plan);
// Ranks of the groups `rank` belongs to, ascending.
std::vector<int> plan_tp_group(const Plan& plan, int rank);
std::vector<int> plan_dp_group(const Plan& plan, int rank);
// Mixture-of-Experts: the expert-parallel group of `rank` (its stage's ranks of its tp rank and
// expert-parallel group, ascending), and the ranks that hold the same experts as it (one per
// expert-parallel group: its experts' data-parallel group).
std::vector<int> plan_ep_group(const Plan& plan, int rank);
std::vector<int> plan_expert_dp_group(const Plan& plan, int rank);
// Devices of that group for member `dp_rank` of `stage` (tp fastest, then dp), in rank order.
std::vector<int> plan_stage_expert_dp_ids(const PlanStage& stage, int dp_rank);
// Routed experts [begin, end) that member `ep_rank` of a stage's expert-parallel groups holds.
std::pair<int, int> plan_expert_range(const PlanStage& stage, int num_experts, int ep_rank);

// `train` with what the plan fixed: its sequence length, global batch and precision (a plan
// may have chosen its batch from a range, and a run's command line may not repeat them).
TrainSpec plan_train_spec(TrainSpec train, const Plan& plan);

struct RenderOptions {
  bool show_memory_terms = true;
  bool show_runner_ups = true;
  // Non-empty: the plan carries no predictions and this says why; its choices are shown alone.
  std::string unpriced_reason;
};
// Aligned text tables for people (`alloy plan`, `alloy explain`).
std::string plan_render_text(const Plan& plan, const RenderOptions& options = {});

}  // namespace alloy
