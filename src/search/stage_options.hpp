// Per-stage choices inside the planner: for a stage position and a number of blocks, the
// Pareto set of (time per micro-batch, per-step overhead) over ZeRO stage, gradient strategy,
// sequence parallelism, recomputation, offload counts and prefetch depth that fit the device's
// memory and the device's share of host memory.
#pragma once

#include <vector>

#include "cost/cost_model.hpp"

namespace alloy {

// A stage position inside one candidate layout.
struct StageSlot {
  StageShape shape;
  const StageUnitCosts* unit[2] = {nullptr, nullptr};  // by sequence parallelism; null: not allowed
  double in_flight = 1;           // micro-batches whose activations the stage holds at its peak
                                  // (with unequal chunks: slot_with_blocks)
  int pipeline_stages = 1;        // of the pipeline, and this stage's index in it
  int stage_index = 0;
  bool has_next = false;          // the pipeline has more than one stage
  double boundary_seconds = 0;    // one send to the next stage
  int chunks_sent = 0;
  int chunks_received = 0;        // chunks of a micro-batch whose input comes from another stage
  double tied_table_seconds = 0;  // per step, first and last stage: summing the table tied between them
  bool has_embedding = false;
  bool has_head = false;
  bool head_holds_lm_matrix = true;
  // MoE models: the model's leading dense blocks from the stage's first block on (those before
  // it taken off). Its chunk c starts c x round_blocks blocks later (round_blocks: the model's
  // blocks over virtual_chunks), so of k blocks per chunk it holds
  // sum over c of clamp(leading - c x round_blocks, 0, k) (stage_slot_dense_blocks).
  int leading_dense_blocks = 0;
  int virtual_chunks = 1;
  int round_blocks = 0;
  int micro_batches = 1;          // per optimizer step
  double capacity_bytes = 0;
  double host_capacity_bytes = 0;  // this device's share of its node's host memory
};

// The slot as a stage of `blocks` blocks sees it: an interleaved stage whose blocks do not divide
// by v has unequal chunks (chunk_blocks) and holds the activations its schedule's peak holds.
StageSlot slot_with_blocks(const StageSlot& slot, int blocks);

struct StageOption {
  double t = 0;  // forward + backward per micro-batch
  double u = 0;  // per-step overhead (exposed gradient sync, optimizer)
  int zero = 0;
  bool shard_gradients = false;  // ZeRO 2-3, dp > 1: reduce-scatter every micro-batch, keep 1/dp
  bool sequence_parallel = false;
  int selective = 0;
  int full = 0;
  int offloaded = 0;
  int prefetch_depth = 1;  // offloaded blocks fetched ahead (1 when none is offloaded, unless pinned)
  int parked = 0;          // blocks whose saved activations wait in host memory: the first ones
                           // not under full recomputation
  int ep = 1;              // expert-parallel degree (MoE models)
};

struct OptionPins {
  int zero = -1;             // -1: free
  int shard_gradients = -1;  // -1: free, 0/1 pinned (where ZeRO 2-3 and dp > 1 allow it)
  int sequence_parallel = -1;  // -1: free, 0/1 pinned
  int recompute = -1;        // -1: free, else a Recompute value for every block
  bool allow_offload = true;
  int prefetch_depth = 0;      // 0: free (1, 2 or 4 where the stage offloads)
  int offload_activations = 0; // blocks per stage whose saved activations wait in host memory
};

// Prefetch depths the planner tries: the pinned one, else 1, 2 and 4 (1 alone without offload).
std::vector<int> stage_prefetch_depths(const OptionPins& pins);

// Offloaded-block counts the planner considers for a stage of `blocks` blocks: 0-4, then
// steps of about 1.5x (6, 9, 13, ...), and all of them. Offload moves memory in coarse buckets.
std::vector<int> stage_offload_counts(int blocks);

// Of a stage's `blocks` blocks (all its chunks'), the leading dense blocks of an MoE model.
int stage_slot_dense_blocks(const StageSlot& slot, int blocks);

StageChoice stage_choice_of(const StageSlot& slot, const StageOption& option, int blocks);

// Fills `out` with the Pareto-optimal options (t ascending, u strictly descending); empty when
// nothing fits. Exact over the counts: blocks are identical, so counts define cost and memory.
void stage_options(const CostModel& cost, const StageSlot& slot, int blocks, const OptionPins& pins,
                   std::vector<StageOption>* out);

// ZeRO stage and gradient strategy of a stage.
struct ZeroSetting {
  int zero = 0;
  bool shard = false;
};

// Most blocks of a stage whose offloaded state fits the slot's share of host memory at `zero`
// (0 where the runtime does not offload at that setting).
int stage_max_offloaded(const CostModel& cost, const StageSlot& slot, int blocks, const ZeroSetting& zero);

// Memory of the most frugal choice for `blocks` blocks (for infeasibility reports); with
// `host_limited`, offloading no more than host memory holds.
double stage_min_memory_bytes(const CostModel& cost, const StageSlot& slot, int blocks, const OptionPins& pins,
                              bool host_limited = true);

// Host memory per device that the fewest offloaded blocks letting the stage fit device memory
// need (with the most frugal other choices); 0 when it fits without offload, infinity when it
// does not fit even with every block offloaded.
double stage_min_host_bytes(const CostModel& cost, const StageSlot& slot, int blocks, const OptionPins& pins);

}  // namespace alloy
