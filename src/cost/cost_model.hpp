// The cost model: time and memory of a pipeline stage on its devices for one micro-batch and
// one optimizer step, from the analytic roofline (or a measured profile) and the communication
// model. Both the planner and plan evaluation go through these functions, so they agree.
#pragma once

#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "cost/comm.hpp"
#include "cost/layer_cost.hpp"
#include "cost/profile.hpp"
#include "cost/runtime_traits.hpp"
#include "spec/cluster.hpp"
#include "spec/model.hpp"
#include "spec/parallel.hpp"
#include "spec/train.hpp"

namespace alloy {

// Fraction of peak a matrix product of M rows by N columns reaches at a precision on a device
// (the analytic efficiency curve: the device's calibrated matmul_efficiency at 16 bits, else its
// runtime's, shaped by the runtime's half sizes; a profile replaces it for measured shapes).
double compute_efficiency(const DeviceType& type, Precision precision, double rows, double cols);
// A device's memory bandwidth as its runtime runs it: an emulated device's scales with its speed.
double device_memory_bytes_per_second(const DeviceType& type);
// Roofline: max(flops / (peak x efficiency), bytes / memory bandwidth); a runtime whose
// element-wise work runs as kernels of its own adds that work's traffic time instead.
double compute_seconds(const DeviceType& type, Precision precision, const LayerWork& work, bool backward);
// What reading a layer's weights cold adds to a pass (RuntimeTraits::cold_weight_bandwidth_share);
// 0 where the runtime's weight reads overlap its math.
double cold_weight_seconds(const DeviceType& type, const LayerWork& work, bool backward);

// A stage's devices as the cost model sees them.
struct StageShape {
  int device_type = 0;
  int tp = 1;
  int dp = 1;
  int64_t micro_batch = 1;       // sequences per replica per micro-batch
  double zero_share = 1.0;       // this member's fraction of what ZeRO shards over dp (1/dp
                                 // unless uneven data parallelism shards by batch share)
  GroupPlacement tp_group;       // always inside one node
  GroupPlacement dp_group;
  // Mixture-of-Experts models (src/cost/moe_cost.hpp; ignored for dense ones): the member's
  // expert-parallel degree, the routed experts of each MoE block it holds, the sequences of each
  // micro-batch whose tokens its group routes (0: micro_batch x ep), its routed token load over
  // the even share of its experts (the expected imbalance) and its share of what ZeRO shards of
  // the experts (over the dp / ep members holding the same ones).
  int ep = 1;
  double held_experts = 0;
  double expert_group_sequences = 0;
  double expert_load_factor = 1.0;
  double expert_zero_share = 1.0;
  GroupPlacement ep_group;
  GroupPlacement expert_dp_group;
};

// Seconds of one layer for one micro-batch on one device, collectives included.
struct LayerTimes {
  double forward_seconds = 0;
  double backward_seconds = 0;
};

// One block as the dense arithmetic (layer_cost.hpp) prices it on a stage shape.
struct DenseBlockCosts {
  LayerTimes compute;                      // the block's own work
  LayerTimes times;                        // with its tensor-parallel collectives
  double recompute_selective_seconds = 0;  // extra backward time
  double recompute_full_seconds = 0;
  double parameters = 0;                   // per device (divided by tp)
  double activation_bytes[3] = {0, 0, 0};  // by Recompute
  double backward_workspace_bytes = 0;     // gradient buffers of its backward
  double offload_weights_seconds = 0;      // its weights over the host link, when offloaded
  double offload_gradients_seconds = 0;    // its gradients over the host link, when offloaded
  double fp8_weight_cast_seconds = 0;      // per step, where the runtime casts weights once a step
};

// Costs of a (stage shape, sequence parallelism) pair that do not depend on the layer choices.
// For MoE models the block fields are an MoE block's; `dense_block` prices the leading dense
// blocks (moe.first_dense_layers), whose MLP is the dense one of ffn_hidden_size.
struct StageUnitCosts {
  bool sequence_parallel = false;
  LayerTimes block;
  LayerTimes embedding;
  LayerTimes head;
  double recompute_selective_seconds = 0;  // extra backward time of one block
  double recompute_full_seconds = 0;
  double offload_weights_seconds = 0;      // one offloaded block's weights over the host link
  double offload_gradients_seconds = 0;    // one offloaded block's gradients over the host link
  double zero3_forward_seconds = 0;        // exposed per-micro-batch gathers of one block
  double zero3_backward_seconds = 0;       // fetched a block ahead (not a pass's first: stage_zero3_first_gathers)
  LayerTimes zero3_hiding;                 // the compute of a block, under which the next unit is gathered
  double block_parameters = 0;             // per device (divided by tp)
  double fp8_weight_cast_seconds = 0;      // one block's, per step (DenseBlockCosts)
  double block_expert_parameters = 0;      // of those, the routed experts' (MoE models)
  double expert_all_to_all_seconds = 0;    // one dispatch or combine of one MoE block (in block times)
  double embedding_parameters = 0;
  double head_parameters = 0;
  double block_activation_bytes[3] = {0, 0, 0};  // by Recompute
  double embedding_activation_bytes = 0;
  double head_activation_bytes = 0;
  double head_backward_workspace_bytes = 0;  // its loss's gradients beyond what the head keeps
  double backward_workspace_bytes = 0;     // gradient buffers of one block's backward
  double boundary_bytes = 0;               // one hidden state of the whole micro-batch
  double block_output_bytes = 0;           // one block's output on this device, per micro-batch
  // Under sequence parallelism Alloy's CPU runtime keeps a chunk's received input and its output
  // gathered for the send whole, each until the chunk's backward: bytes above the rank's rows.
  double chunk_input_extra_bytes = 0;
  double chunk_output_bytes = 0;
  double activations_link_seconds[3] = {0, 0, 0};  // one block's saved activations but its output over
                                                   // the host link, by recomputation level
  DenseBlockCosts dense_block;  // MoE models with leading dense blocks (zero otherwise)
};

// What a stage runs: layer counts by choice. Blocks of a kind are identical, so counts define
// the cost: an MoE model's leading dense blocks apart from its MoE blocks.
struct StageChoice {
  int blocks = 0;
  int selective = 0;   // blocks under selective recompute
  int full = 0;        // blocks under full recompute
  // MoE models: of the counts above, the leading dense blocks' (moe.first_dense_layers); every
  // other block is an MoE block.
  int dense_blocks = 0;
  int dense_selective = 0;
  int dense_full = 0;
  int offloaded = 0;   // blocks whose weights and optimizer state live in host memory
  // MoE models: of those, the leading dense blocks' (offloaded blocks are a stage's first, so its
  // dense blocks go first).
  int dense_offloaded = 0;
  int prefetch_depth = 1;  // offloaded blocks fetched ahead of their use (window: depth + 1)
  int micro_batches = 1;   // per optimizer step: later backwards also fetch the gradients so far
  int parked_selective = 0;  // blocks under selective recompute whose saved activations wait in host memory
  int parked_none = 0;       // the same, blocks without recomputation (full recompute saves nothing to park)
  int zero = 0;        // ZeRO stage 0-3
  // Under ZeRO 2-3 with dp > 1: reduce-scatter after every micro-batch and keep 1/dp of the
  // gradients (PlanStage::shard_gradients); false: accumulate them in full, reduce once.
  bool shard_gradients = false;
  bool has_embedding = false;
  bool has_head = false;
  bool head_holds_lm_matrix = true;
  int chunks_sent = 0;      // of the stage's chunks of one micro-batch: outputs sent to a stage
  int chunks_received = 0;  // and inputs received from one
  int virtual_chunks = 1;   // chunks of the stage (sized by stage_chunk_blocks), each a pass per micro-batch
};

struct StageTiming {
  double forward_seconds = 0;       // per micro-batch, all chunks, stage-boundary sends included
  double backward_seconds = 0;      // per micro-batch, recomputation and exposed transfers included
  double gradient_sync_seconds = 0;  // per step, exposed after overlap with the last backward
  double optimizer_seconds = 0;      // per step
  double offload_forward_seconds = 0;   // per micro-batch, host copies not hidden (in forward_seconds)
  double offload_backward_seconds = 0;  // per micro-batch, host copies not hidden (in backward_seconds)
  double boundary_send_seconds = 0;     // per micro-batch, in forward_seconds and again in backward_seconds
  // Per micro-batch, ZeRO 3: the gathers the stage's passes wait for before their first block
  // (stage_zero3_first_gathers), in forward_seconds and in backward_seconds.
  double first_gather_forward_seconds = 0;
  double first_gather_backward_seconds = 0;
  double step_overhead_seconds() const { return gradient_sync_seconds + optimizer_seconds; }
  double per_micro_batch_seconds() const { return forward_seconds + backward_seconds; }
};

// The ZeRO-3 gathers of a stage that nothing hides, per micro-batch. Each pass (a chunk's forward
// or backward) gathers its first block alone before it starts, with the embedding if it is the
// stage's first block and the head if it is its last; every later unit is gathered a block
// ahead, under the compute (Alloy's runtime, Zero3Parameters: the head after the last block's
// forward, the embedding after the first block's backward). Offloaded blocks come from host
// memory and are not gathered, nor do they prefetch: a forward pass that opens on them gathers
// its first resident block alone when it reaches it (unless the embedding opens the pass).
struct Zero3FirstGathers {
  double forward_seconds = 0;   // summed over the stage's forward passes
  double backward_seconds = 0;
  int forward_blocks = 0;       // blocks gathered so, one per pass whose first block is resident
  int backward_blocks = 0;
  // The head gathered a block ahead in forward, the embedding in backward: the part their
  // block's compute does not hide.
  double ahead_forward_seconds = 0;
  double ahead_backward_seconds = 0;
};

// Forward plus backward seconds of one micro-batch through each kind of layer.
struct LayerSecondsBound {
  double block = 0;
  double embedding = 0;
  double head = 0;
};

// Per micro-batch seconds of host copies not hidden behind compute.
struct OffloadExposure {
  double forward_seconds = 0;
  double backward_seconds = 0;
};

// The gradient buckets of a stage's backward as the schedule cuts them (schedule.cpp): whole
// blocks from the last block back, a bucket closing once it holds TrainSpec::gradient_bucket_mib
// in the plan's precision. Bytes in that precision.
struct StageBuckets {
  int count = 0;
  double last_bytes = 0;     // the one holding the first blocks, posted after the whole backward
  double largest_bytes = 0;
};

// What a stage's gradient reduction over its dp group takes at least, before any of it hides
// behind the backward, whatever its ZeRO stage and gradient strategy: for n blocks (1 <= n <= the
// model's), at least max(one_block_seconds, fixed_seconds + n per_block_seconds).
struct GradientReduceBound {
  double one_block_seconds = 0;
  double fixed_seconds = 0;
  double per_block_seconds = 0;  // >= 0
};

// The exposed gradient sync per step of a stage of n blocks (1 <= n <= the model's), whatever its
// ZeRO stage, gradient strategy, recomputation and offload: at least
// max(floor_seconds, fixed_seconds + n per_block_seconds).
struct GradientSyncBound {
  double floor_seconds = 0;
  double fixed_seconds = 0;      // may be negative
  double per_block_seconds = 0;  // >= 0
};

// Memory of one device of a stage, every term named.
struct MemoryBreakdown {
  double parameters_bytes = 0;
  double gradients_bytes = 0;
  double master_weights_bytes = 0;
  double optimizer_states_bytes = 0;
  double zero3_gather_bytes = 0;        // full weights of the layers being gathered
  double offload_window_bytes = 0;      // resident prefetch window of offloaded layers
  double activations_bytes = 0;         // all micro-batches in flight
  double workspace_bytes = 0;           // library workspace and recomputation transients
  double communication_buffers_bytes = 0;
  double framework_context_bytes = 0;   // e.g. the CUDA context
  double allocator_margin_bytes = 0;    // fragmentation reserve
  double host_offload_bytes = 0;        // kept in host memory, not counted in total
  double total_bytes() const;
};

class CostModel {
 public:
  CostModel(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train,
            const Profile* profile = nullptr);
  CostModel(const CostModel&) = delete;
  CostModel& operator=(const CostModel&) = delete;

  const ModelSpec& model() const { return model_; }
  const ClusterSpec& cluster() const { return cluster_; }
  const TrainSpec& train() const { return train_; }
  const Profile* profile() const { return profile_; }  // null without --profile
  // MoE: each routed expert's measured share of the picks (TrainSpec::expert_tokens); empty:
  // uniform routing.
  const std::vector<double>& expert_token_shares() const { return expert_shares_; }

  // The stage's groups from the device ids it uses (ranks ordered tp fastest, then dp).
  StageShape stage_shape(const std::vector<int>& device_ids, int tp, int dp, int64_t micro_batch) const;
  // The path between two adjacent stages.
  BoundaryLink boundary_link(const std::vector<int>& from_devices, const std::vector<int>& to_devices) const;

  StageUnitCosts unit_costs(const StageShape& shape, bool sequence_parallel) const;
  // chunks_sent: boundary sends per micro-batch (v, or v-1 for the last stage when interleaved).
  StageTiming stage_timing(const StageShape& shape, const StageUnitCosts& unit, const StageChoice& choice,
                           double boundary_send_seconds, int chunks_sent) const;
  // The two parts of stage_timing: everything but the gradient sync (left 0), and the exposed
  // gradient sync per step, which depends on the stage's layers, shape and ZeRO stage only (not
  // on recomputation, offload or prefetch depth), so a search can price it once for all of them.
  StageTiming stage_timing_without_sync(const StageShape& shape, const StageUnitCosts& unit, const StageChoice& choice,
                                        double boundary_send_seconds, int chunks_sent) const;
  // Accumulated gradients (choice.shard_gradients false) are reduced once per step; sharded
  // ones after every micro-batch, the earlier reductions hidden behind the next passes where the
  // device can overlap them.
  double stage_gradient_sync_seconds(const StageShape& shape, const StageUnitCosts& unit, const StageChoice& choice) const;
  // Bytes of one gradient element as it accumulates and is reduced: fp32 beside fp32 master
  // weights, else the compute precision's.
  double gradient_element_bytes() const;
  // What a gradient element takes on the wire in a stage's reductions at ZeRO stage `zero`: as
  // accumulated, or bf16 in ZeRO 2-3 reduce-scatters under gradient_communication: bf16.
  double gradient_wire_bytes(int zero) const;
  // Lower bounds for a search to prune by (dense models; zero for Mixture-of-Experts ones and
  // dp 1): the gradient reduction of a stage on `shape`, and from it the exposed sync of a stage
  // whose unit costs are `unit` and that holds the embedding and head where flagged (true is
  // valid for a stage without them, only looser).
  GradientReduceBound stage_gradient_reduce_bound(const StageShape& shape) const;
  GradientSyncBound stage_gradient_sync_bound(const GradientReduceBound& reduce, const StageUnitCosts& unit,
                                              bool embedding, bool head) const;
  // The buckets of the stage's backward, per device, in accumulated gradient bytes.
  StageBuckets stage_gradient_buckets(const StageShape& shape, const StageUnitCosts& unit, const StageChoice& choice) const;
  // ZeRO 3 with dp > 1 (zero otherwise): the gathers each pass waits for before its first block.
  // A stage's leading dense blocks (MoE models) are taken to open its first chunk.
  Zero3FirstGathers stage_zero3_first_gathers(const StageShape& shape, const StageUnitCosts& unit,
                                              const StageChoice& choice) const;
  // Host copies of offloaded weights and parked activations not hidden behind compute, per
  // micro-batch: the part of stage_timing that depends on the offloaded count and the depth.
  OffloadExposure stage_offload_exposure(const StageUnitCosts& unit, const StageChoice& choice) const;
  MemoryBreakdown stage_memory(const StageShape& shape, const StageUnitCosts& unit,
                               const StageChoice& choice, double micro_batches_in_flight,
                               bool has_next_stage) const;

  // Forward plus backward of one block, the embedding and the head with their tp collectives
  // (which stay inside a node, so they do not depend on placement): lower bounds on their
  // times, used to order and prune candidate layouts.
  LayerSecondsBound layer_seconds_bound(int device_type, int tp, int64_t micro_batch, bool sequence_parallel) const;

  // Capacity of one device of a type, and the intra-node link of a type's nodes.
  double device_memory_bytes(int device_type) const;
  // One device's share of its node's host memory (host_memory / devices_per_node), the smallest
  // over the type's node groups: what its offloaded blocks may keep on the host.
  double host_memory_share_bytes(int device_type) const;
  Link type_intra_node_link(int device_type) const;

  // Shapes where a profile was given but had no measurement, so the analytic model was used.
  std::vector<std::string> fallback_notes() const;

 private:
  // Whether a profile's measured collectives price `group` (where it has them).
  bool profile_collectives_price(const GroupPlacement& group) const;
  // A collective on a group of a device type: measured when the profile has it, else analytic
  // (and noted as such unless `note_fallback` is false).
  double group_seconds(int device_type, CollectiveOp op, double bytes, const GroupPlacement& group,
                       bool note_fallback = true) const;
  LayerTimes layer_times(const StageShape& shape, LayerKind kind, bool sp, const LayerWork& work) const;
  // Exposed seconds of one reduce-scatter of sharded gradients after a micro-batch other than the
  // step's last, which the next passes can hide; `reduce`: the whole stage's, `last_bucket`: the
  // bucket posted after the backward.
  double earlier_reduce_scatter_seconds(const StageShape& shape, const StageUnitCosts& unit, const StageChoice& choice,
                                        double reduce, double last_bucket) const;
  // Parameters per device of the stage's head, if it has one (with or without the lm matrix).
  double stage_head_parameters(const StageShape& shape, const StageUnitCosts& unit, const StageChoice& choice) const;
  // Parameters per device of a stage's layers (all of them, offloaded or not).
  double stage_parameters(const StageShape& shape, const StageUnitCosts& unit, const StageChoice& choice) const;
  // Parameters of a table tied between the pipeline's first and last stage that this stage holds:
  // synchronised whole between them, the runtime keeps the table (and its optimizer state)
  // unsharded under ZeRO, and every member updates it whole. 0 for other stages.
  double stage_unsharded_tied_parameters(const StageShape& shape, const StageChoice& choice) const;
  // Whether the stage's runtime keeps its ZeRO-3 weights gathered for the whole step
  // (RuntimeTraits::zero3_pipelined_keeps_weights_gathered and a pipelined stage).
  bool stage_keeps_weights_gathered(const StageShape& shape, const StageChoice& choice) const;
  // A block of `model` (the dense part of an MoE block, or a dense block) on `shape`;
  // `mlp_sums_over_tp`: its MLP is split over tp and sums its output (false for an MoE block's,
  // which every tp rank runs whole).
  DenseBlockCosts dense_block_costs(const ModelSpec& model, const StageShape& shape, bool sequence_parallel,
                                    bool mlp_sums_over_tp) const;
  // Fills priced_types_ (and notes the dilation it applied).
  void priced_types_set();

  // Copies: a cost model outlives the specs it was built from.
  ModelSpec model_;
  ClusterSpec cluster_;
  TrainSpec train_;
  const Profile* profile_;  // not owned; must outlive the cost model
  std::vector<Link> type_links_;
  // The cluster's device types as the analytic model prices their compute: a type whose runtime
  // shares the host's cores runs at its speed over the time dilation of the cluster's devices.
  std::vector<DeviceType> priced_types_;
  // The CPU devices sharing this machine's cores and their time dilation.
  SharedCores shared_cores_;
  ModelSpec dense_part_;  // MoE models: the blocks without their routed experts (moe_cost.hpp)
  ModelSpec leading_dense_;  // MoE models: the leading dense blocks, the model without its experts
  std::vector<double> expert_shares_;
  mutable std::mutex notes_mutex_;
  mutable std::set<std::string> notes_;
};

// Sum over a stage's blocks of a per-block quantity: `per_block` for each of its blocks but the
// leading dense ones of an MoE model, which take `per_dense_block`.
double stage_blocks_sum(const StageChoice& choice, double per_block, double per_dense_block);

// Sets choice's dense counts for `dense_blocks` leading dense blocks of its blocks, recomputed
// and offloaded as a plan does a stage's blocks: the first `full` fully, the next `selective`
// selectively, the first `offloaded` to host memory (search/explain.cpp).
void stage_choice_set_dense_blocks(StageChoice* choice, int dense_blocks);

// Parameters per device of a stage's offloaded blocks, and of those the routed experts'.
double stage_offloaded_parameters(const StageUnitCosts& unit, const StageChoice& choice);
double stage_offloaded_expert_parameters(const StageUnitCosts& unit, const StageChoice& choice);

// Whether a stage keeps only its shard of the gradients (strategy (a), PlanStage::gradients_sharded):
// choice.shard_gradients under ZeRO 2-3 with someone to shard over.
bool stage_gradients_sharded(const StageShape& shape, const StageChoice& choice);

// Exposed seconds of one pass over `offloaded` blocks streamed from host memory, each taking
// `transfer_seconds` on the link and `compute_seconds` on the device, `depth` fetched ahead, with
// `window_compute_seconds` of other work before the run to hide the first fetches behind:
// max(0, t + (k - 1) max(0, t - c) - min(W, depth t)); 0 without offloaded blocks.
double offload_exposed_seconds(int offloaded, int depth, double transfer_seconds, double compute_seconds,
                               double window_compute_seconds);
// Blocks of one kind in a run streamed from host memory: how many, and each one's link and
// compute seconds.
struct OffloadedRun {
  int count = 0;
  double transfer_seconds = 0;
  double compute_seconds = 0;
};
// The same over a run of two kinds of blocks, `first` streamed before `then` (an MoE model's
// leading dense blocks and its MoE blocks): the run's first fetch, plus each later block's link
// excess over its compute, less the head start (at most `depth` of the first fetches).
double offload_exposed_seconds(const OffloadedRun& first, const OffloadedRun& then, int depth,
                               double window_compute_seconds);

// One kind of offloaded block as the offload window streams it: its weights' and gradients'
// seconds on the host link (each direction) and its passes' seconds on the device.
struct OffloadedBlockKind {
  int count = 0;
  double weights_seconds = 0;
  double gradients_seconds = 0;
  double forward_seconds = 0;
  double backward_seconds = 0;
  bool operator==(const OffloadedBlockKind&) const = default;
};
// A stage's passes around its offloaded run (the stage's first blocks): `first` kind then `then`
// forward (an MoE model's leading dense blocks, then its MoE blocks), the other way backward,
// with the work before and after the run in each pass.
struct OffloadedPasses {
  OffloadedBlockKind first;
  OffloadedBlockKind then;
  double before_forward_seconds = 0;   // the embedding's forward
  double after_forward_seconds = 0;    // the resident blocks' and the head's forward
  double before_backward_seconds = 0;  // the head's and the resident blocks' backward
  double after_backward_seconds = 0;   // the embedding's backward
  bool operator==(const OffloadedPasses&) const = default;
};
// Seconds per micro-batch that a stage's forward and backward wait for the offload window
// (LayerOffload): one fetch thread filling min(depth + 1, blocks) slots use after use, a slot
// freed when a forward ends or a backward's gradients are home (a second thread writes them
// back, the link's other direction), a later backward's accumulated gradients fetched once the
// block's previous write-back landed. Runs the step's first micro-batches (a forward then a
// backward each, up to three), the last standing for the rest; O(blocks).
OffloadExposure offload_window_exposure(const OffloadedPasses& passes, int depth, int micro_batches);

// Micro-batches whose activations a stage holds at its peak under a schedule; for interleaved
// schedules in units of whole-stage activations (chunks held / v).
double schedule_micro_batches_in_flight(Schedule schedule, int stages, int stage, int micro_batches,
                                        int virtual_chunks);
// The same for a stage whose chunks hold `chunk_blocks` blocks (one entry per chunk): where they
// are unequal, the peak over the step of the held chunks' blocks (the steady state can hold more
// large chunks than the warm-up) over the stage's blocks.
double schedule_micro_batches_in_flight(Schedule schedule, int stages, int stage, int micro_batches,
                                        const std::vector<int>& chunk_blocks);
// Blocks per chunk of a stage of `blocks` blocks in `v` chunks sized by chunk_blocks.
std::vector<int> stage_chunk_blocks(int blocks, int v);

// Step time of a pipeline from per-stage times: fill and drain over the sum of the stages, the
// steady state on each stage, and its per-step overhead after its last backward.
double pipeline_step_seconds(const std::vector<double>& per_micro_batch_seconds,
                             const std::vector<double>& step_overhead_seconds, int micro_batches,
                             int virtual_chunks);
// The same with each stage's share of its time in its first chunk (`fill_fraction`, 1/v for
// equal chunks): the first micro-batch's first chunks fill the pipeline and its last's drain it,
// so step = sum_s f_s t_s + max_s ((m - f_s) t_s + overhead_s).
double pipeline_step_seconds(const std::vector<double>& per_micro_batch_seconds, const std::vector<double>& fill_fraction,
                             const std::vector<double>& step_overhead_seconds, int micro_batches);
// Share of a stage's time per micro-batch in its first chunk: the first chunk's blocks over the
// stage's (chunk_blocks sizes them), 1 without interleaving.
double stage_fill_fraction(int blocks, int virtual_chunks);

}  // namespace alloy
