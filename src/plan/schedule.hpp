// The step schedule: the ordered list of operations every rank runs for one optimizer step,
// generated once from a plan. The simulator replays it and the runtime executes it unchanged.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "plan/plan.hpp"
#include "spec/model.hpp"

namespace alloy {

enum class OpKind {
  OpKind_forward,          // forward of blocks [block_begin, block_end) for one micro-batch
  OpKind_backward,         // backward of those blocks (the last one of a chunk, or every one under
                           // sharded gradients, comes in buckets)
  OpKind_send_activation,  // hidden state to the next virtual stage
  OpKind_recv_activation,
  OpKind_send_gradient,    // gradient of the hidden state to the previous virtual stage
  OpKind_recv_gradient,
  OpKind_all_reduce,       // gradient bucket over the data-parallel group (ZeRO 0)
  OpKind_reduce_scatter,   // gradient bucket over the data-parallel group (ZeRO 1-3)
  OpKind_all_gather,       // parameters over the data-parallel group (ZeRO-3 before use, ZeRO 1-2 after the step)
  OpKind_optimizer,        // optimizer step on the rank's (shard of the) parameters
  OpKind_prefetch,         // offloaded weights of the blocks: host to device
  OpKind_evict,            // drop them again; after backward, gradients go back to the host
};
const char* op_kind_name(OpKind kind);
bool op_kind_is_compute(OpKind kind);     // forward, backward, optimizer
bool op_kind_is_send(OpKind kind);
bool op_kind_is_recv(OpKind kind);
bool op_kind_is_collective(OpKind kind);  // over the rank's data-parallel group

// Semantics the runtime and the checker share: a send is posted and returns at once (the
// buffer stays alive until the step ends); a receive blocks until its matching send's data
// is there; collectives block every member of the rank's data-parallel group until all joined,
// and members call them in the same order.
struct ScheduleOp {
  OpKind kind = OpKind::OpKind_forward;
  int micro_batch = -1;        // -1: once per step (optimizer, post-step gathers)
  int chunk = 0;               // model chunk of the stage (interleaved: 0..v-1)
  int peer = -1;               // send/recv: the other rank
  int tag = -1;                // send/recv: equal on both sides; unique per pair of ranks
  int64_t bytes = 0;           // payload of a transfer, bucket or gather (over the data-parallel group)
  int64_t expert_bytes = 0;    // buckets and gathers of an expert-parallel stage: the routed experts'
                               // part, reduced and gathered over the expert-dp group (plan_expert_dp_group)
  int64_t sample_begin = 0;    // send/recv and compute: global samples [begin, end) of the step
  int64_t sample_end = 0;
  int block_begin = 0;         // model blocks [begin, end) the op works on
  int block_end = 0;
  int bucket = -1;             // gradient bucket index inside the chunk (reductions, backward pieces)
};

struct RankSchedule {
  int rank = 0;
  int stage = 0;
  int tp_rank = 0;
  int dp_rank = 0;
  int device_id = 0;
  std::vector<ScheduleOp> ops;
};

struct StepSchedule {
  Schedule schedule = Schedule::Schedule_1f1b;
  int num_stages = 0;
  int virtual_chunks = 1;
  int num_micro_batches = 0;
  std::vector<RankSchedule> ranks;  // indexed by global rank (plan_rank_map order)
};

struct ScheduleOptions {
  // Target size of one gradient-reduction bucket; buckets hold whole blocks, so a bucket is
  // at least one block. The last backward of each chunk runs bucket by bucket so reductions
  // overlap the rest of it.
  double bucket_bytes = 64.0 * 1024 * 1024;
  // Per stage: one block's saved activations but its output, per micro-batch, at recomputation
  // none and selective, for the blocks the plan parks in host memory (offload_activations):
  // they leave after the forward and come back before the backward. Empty: not counted.
  std::vector<std::array<int64_t, 2>> parked_block_bytes;
};

// The operations of one rank (cheap: the simulator builds only representative ranks).
// Throws alloy::Error when the plan cannot be scheduled (field named).
RankSchedule schedule_build_rank(const Plan& plan, const ModelSpec& model, int rank,
                                 const ScheduleOptions& options = {});
// Every rank of the plan.
StepSchedule schedule_build(const Plan& plan, const ModelSpec& model, const ScheduleOptions& options = {});

// Proves the schedule can run: every send has exactly one matching receive (peer, tag, kind,
// bytes, samples) and vice versa, members of each data-parallel group call the same collectives
// in the same order, and the dependency graph (program order on every rank, send -> receive,
// collectives joined across their group) has no cycle. Throws alloy::Error naming the rank and
// the operation (index and description) at fault.
void schedule_check(const StepSchedule& schedule);

// "recv_activation mb 3 chunk 0 from rank 2 tag 17 (4.0 MiB, samples [12, 16))" and similar.
std::string schedule_op_describe(const ScheduleOp& op);

// Bytes of gradients (and parameters) per device of a stage for blocks [begin, end) that are
// sharded and reduced over the data-parallel group, in the plan's precision: all of them but the
// routed experts of an expert-parallel stage (schedule_expert_bytes). The first block also
// carries the embedding on stage 0, the last block of the last stage the head.
int64_t schedule_parameter_bytes(const Plan& plan, const ModelSpec& model, int stage, int block_begin,
                                 int block_end);
// The same blocks' gradients at `element_bytes` each (the plan's gradient_bytes or
// reduce_scatter_bytes): what the schedule's buckets and reductions hold and move.
int64_t schedule_gradient_bytes(const Plan& plan, const ModelSpec& model, int stage, int block_begin, int block_end,
                                int element_bytes);
// Bytes at `element_bytes` each of the routed experts that member `dp_rank` of an expert-parallel
// stage holds in blocks [begin, end), sharded and reduced over its expert-dp group; 0 with ep 1.
int64_t schedule_expert_bytes(const Plan& plan, const ModelSpec& model, int stage, int dp_rank, int block_begin,
                              int block_end, int element_bytes);
// Bytes at `element_bytes` each of block `block` alone (no embedding or head) on member `dp_rank`
// of `stage`, its routed experts included: what an offloaded block moves over the host link.
int64_t schedule_offloaded_block_bytes(const Plan& plan, const ModelSpec& model, int stage, int dp_rank, int block,
                                       int element_bytes);
// Weights of one routed expert (gate, up and down: 3 C F_e); 0 for a dense model.
int64_t schedule_expert_parameters(const ModelSpec& model);

}  // namespace alloy
