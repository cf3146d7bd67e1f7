// Schedule generation: compute order per pipeline schedule (GPipe, 1F1B, interleaved 1F1B),
// the transfers between stages by sample range, gradient buckets, ZeRO gathers and offload.
#include "plan/schedule.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "spec/error.hpp"
#include "spec/moe.hpp"

namespace alloy {

namespace {

// Parameters per device of a stage for blocks [begin, end) that are sharded and reduced over dp
// (see schedule_parameter_bytes): an MoE block's attention and norms split over tp, its router and
// shared experts whole on every tp rank (the runtime replicates the MoE MLP over tp), and its
// routed experts unless expert parallelism shards them over expert-dp instead.
// `with_edges`: the embedding and head count with the stage's first and last block; without,
// the blocks alone (what an offloaded block keeps in host memory).
int64_t stage_parameter_count(const Plan& plan, const ModelSpec& model, int stage, int block_begin, int block_end,
                              bool with_edges = true) {
  const ModelParameterCounts counts = model_parameter_counts(model);
  const PlanStage& st = plan.stages[stage];
  const int dense_blocks = model_is_moe(model) ? static_cast<int>(model.moe.first_dense_layers) : block_end;
  const int dense_in = std::clamp(dense_blocks, block_begin, block_end) - block_begin;
  int64_t params = counts.per_block * dense_in;
  int64_t replicated = 0;  // whole on every tp rank
  if (dense_in < block_end - block_begin) {
    const int64_t moe_blocks = block_end - block_begin - dense_in;
    const int64_t mlp = moe_mlp_parameters(model).all;
    const int64_t routed = model.moe.num_experts * schedule_expert_parameters(model);
    params += moe_blocks * (counts.per_moe_block - mlp);
    replicated = moe_blocks * (mlp - (st.ep > 1 ? routed : 0));
  }
  if (!with_edges) return params / st.tp + replicated;
  const int first_block = st.chunks.front().begin;
  const int last_block = st.chunks.back().end;
  if (st.has_embedding && block_begin <= first_block && first_block < block_end) params += counts.embedding;
  if (st.has_head && block_begin < last_block && last_block <= block_end) {
    params += counts.final_norm + counts.lm_head;
    // A tied head on its own stage keeps a copy of the embedding matrix.
    if (counts.lm_head == 0 && plan.stages.size() > 1) params += model.vocab_size * model.hidden_size;
  }
  return params / st.tp + replicated;
}

// Routed experts per MoE block that member `dp_rank` of an expert-parallel stage holds.
int64_t member_expert_count(const PlanStage& st, const ModelSpec& model, int dp_rank) {
  const auto [begin, end] = plan_expert_range(st, static_cast<int>(model.moe.num_experts), dp_rank % st.ep);
  return end - begin;
}

int64_t moe_blocks_in(const ModelSpec& model, int block_begin, int block_end) {
  if (!model_is_moe(model)) return 0;
  return block_end - std::clamp(static_cast<int>(model.moe.first_dense_layers), block_begin, block_end);
}

struct ComputeItem {
  bool forward = true;
  int micro_batch = 0;
  int chunk = 0;
  int piece = 0;  // of the replica's share (uneven data parallelism; 0 otherwise)
};

// A replica whose share runs in pieces: each micro-batch's forward and backward become one pair
// per piece, in turn, so one piece's activations are alive at a time. Single-stage 1F1B plans
// only (plan_validate), where each forward is followed by its own backward.
std::vector<ComputeItem> split_into_pieces(const std::vector<ComputeItem>& items, int pieces) {
  if (pieces <= 1) return items;
  std::vector<ComputeItem> out;
  for (const ComputeItem& item : items) {
    if (!item.forward) continue;
    for (int k = 0; k < pieces; ++k) {
      out.push_back({true, item.micro_batch, item.chunk, k});
      out.push_back({false, item.micro_batch, item.chunk, k});
    }
  }
  return out;
}

// Megatron-style interleaving: micro-batches go in groups of p (the last group may be
// smaller); inside a group every chunk runs for the whole group before the next chunk.
ComputeItem interleaved_item(int k, bool forward, int p, int m, int v) {
  const int group = k / (p * v);
  const int base = group * p;
  const int group_size = std::min(p, m - base);
  const int chunk = interleaved_forward_chunk(k, p, m, v);
  return {forward, base + (k - group * p * v) % group_size, forward ? chunk : v - 1 - chunk};
}

std::vector<ComputeItem> compute_order(Schedule schedule, int p, int s, int m, int v) {
  std::vector<ComputeItem> items;
  if (schedule == Schedule::Schedule_gpipe) {
    for (int i = 0; i < m; ++i) items.push_back({true, i, 0});
    for (int i = 0; i < m; ++i) items.push_back({false, i, 0});
    return items;
  }
  if (schedule == Schedule::Schedule_1f1b) {
    const int warmup = std::min(p - s - 1, m);
    for (int i = 0; i < warmup; ++i) items.push_back({true, i, 0});
    for (int i = 0; i < m - warmup; ++i) {
      items.push_back({true, warmup + i, 0});
      items.push_back({false, i, 0});
    }
    for (int i = m - warmup; i < m; ++i) items.push_back({false, i, 0});
    return items;
  }
  const int total = m * v;
  const int warmup = interleaved_warmup_chunks(p, s, m, v);
  for (int k = 0; k < warmup; ++k) items.push_back(interleaved_item(k, true, p, m, v));
  for (int k = 0; k < total - warmup; ++k) {
    items.push_back(interleaved_item(warmup + k, true, p, m, v));
    items.push_back(interleaved_item(k, false, p, m, v));
  }
  for (int k = total - warmup; k < total; ++k) items.push_back(interleaved_item(k, false, p, m, v));
  return items;
}

struct Builder {
  const Plan& plan;
  const ModelSpec& model;
  const ScheduleOptions& options;
  std::vector<int> first_rank;  // per stage
  int p = 0;
  int v = 1;
  int64_t bytes_per_sample = 0;

  int rank_of(int stage, int tp_rank, int dp_rank) const {
    return first_rank[stage] + dp_rank * plan.stages[stage].tp + tp_rank;
  }
  int64_t replica_samples(int stage, int dp_rank) const {
    return plan.stages[stage].replica_sequences(plan.micro_batch_sequences, dp_rank);
  }
  int64_t sample_begin(int stage, int micro_batch, int dp_rank) const {
    return micro_batch * plan.micro_batch_sequences + plan.stages[stage].replica_offset(plan.micro_batch_sequences, dp_rank);
  }
  // One tag per (micro-batch, boundary between virtual stages b and b+1, direction).
  int tag_of(int micro_batch, int boundary, bool gradient) const {
    return (micro_batch * (p * v - 1) + boundary) * 2 + (gradient ? 1 : 0);
  }

  // Transfers of one micro-batch from stage `from` to stage `to`: a receiver on tp rank t takes
  // its samples from the sender replicas that hold them, on tp rank t % tp_from.
  void add_transfers(RankSchedule* rs, bool sending, bool gradient, int from, int to, int micro_batch,
                     int chunk, int boundary) const {
    const PlanStage& sf = plan.stages[from];
    const PlanStage& st = plan.stages[to];
    const int tag = tag_of(micro_batch, boundary, gradient);
    const OpKind kind = gradient ? (sending ? OpKind::OpKind_send_gradient : OpKind::OpKind_recv_gradient)
                                 : (sending ? OpKind::OpKind_send_activation : OpKind::OpKind_recv_activation);
    const int other_stage = sending ? to : from;
    const PlanStage& other = plan.stages[other_stage];
    const int64_t my_begin = sample_begin(rs->stage, micro_batch, rs->dp_rank);
    const int64_t my_end = my_begin + replica_samples(rs->stage, rs->dp_rank);
    for (int e = 0; e < other.dp; ++e) {
      const int64_t begin = std::max(my_begin, sample_begin(other_stage, micro_batch, e));
      const int64_t end = std::min(my_end, sample_begin(other_stage, micro_batch, e) + replica_samples(other_stage, e));
      if (begin >= end) continue;
      std::vector<int> peers;
      if (sending) {
        for (int j = 0; j < st.tp; ++j)
          if (j % sf.tp == rs->tp_rank) peers.push_back(rank_of(to, j, e));
      } else {
        peers.push_back(rank_of(from, rs->tp_rank % sf.tp, e));
      }
      for (int peer : peers) {
        ScheduleOp op;
        op.kind = kind;
        op.micro_batch = micro_batch;
        op.chunk = chunk;
        op.peer = peer;
        op.tag = tag;
        op.bytes = (end - begin) * bytes_per_sample;
        op.sample_begin = begin;
        op.sample_end = end;
        rs->ops.push_back(op);
      }
    }
  }

  // Index among the stage's blocks (chunks in order) of the chunk's first block.
  int chunk_first_local(int stage, const LayerRange& blocks) const {
    const PlanStage& st = plan.stages[stage];
    int local = 0;
    for (int c = 0; c < v; ++c) {
      const LayerRange& r = st.chunks[c];
      if (r.begin == blocks.begin) break;
      local += r.size();
    }
    return local;
  }

  int64_t offloaded_bytes(int stage, int dp_rank, const LayerRange& blocks) const {
    const PlanStage& st = plan.stages[stage];
    const int local = chunk_first_local(stage, blocks);
    int64_t bytes = 0;
    for (int b = blocks.begin; b < blocks.end; ++b)
      if (st.offload[local + b - blocks.begin])
        bytes += schedule_offloaded_block_bytes(plan, model, stage, dp_rank, b, precision_bytes(plan.precision));
    return bytes;
  }

  // Saved activations of the chunk's parked blocks, one micro-batch.
  int64_t parked_bytes(int stage, const LayerRange& blocks) const {
    const PlanStage& st = plan.stages[stage];
    if (static_cast<size_t>(stage) >= options.parked_block_bytes.size() || st.offload_activations.empty()) return 0;
    const int local = chunk_first_local(stage, blocks);
    int64_t bytes = 0;
    for (int b = blocks.begin; b < blocks.end; ++b) {
      const size_t i = static_cast<size_t>(local + b - blocks.begin);
      if (!st.offload_activations[i] || st.recompute[i] == Recompute::Recompute_full) continue;
      bytes += options.parked_block_bytes[static_cast<size_t>(stage)][st.recompute[i] == Recompute::Recompute_none ? 0 : 1];
    }
    return bytes;
  }

  ScheduleOp step_op(OpKind kind, int chunk, const LayerRange& blocks, int64_t bytes) const {
    ScheduleOp op;
    op.kind = kind;
    op.chunk = chunk;
    op.block_begin = blocks.begin;
    op.block_end = blocks.end;
    op.bytes = bytes;
    return op;
  }

  // Gradient bytes of block b's routed experts on a mean member of an expert-parallel stage: every
  // member cuts its buckets alike, however unevenly the members share the experts.
  int64_t mean_expert_bytes(int stage, int b) const {
    const PlanStage& st = plan.stages[stage];
    if (st.ep <= 1) return 0;
    return moe_blocks_in(model, b, b + 1) * model.moe.num_experts / st.ep * schedule_expert_parameters(model) *
           plan.gradient_bytes;
  }

  // The routed experts' part of a gather or reduction of blocks `blocks` (expert_bytes).
  ScheduleOp with_experts(ScheduleOp op, const RankSchedule& rs, int element_bytes) const {
    op.expert_bytes = schedule_expert_bytes(plan, model, rs.stage, rs.dp_rank, op.block_begin, op.block_end, element_bytes);
    return op;
  }

  // Buckets of a chunk in backward order (last blocks first), each at least one block.
  std::vector<LayerRange> buckets(int stage, const LayerRange& blocks) const {
    std::vector<LayerRange> out;
    int end = blocks.end;
    int64_t bytes = 0;
    for (int b = blocks.end - 1; b >= blocks.begin; --b) {
      bytes += schedule_gradient_bytes(plan, model, stage, b, b + 1, plan.gradient_bytes) + mean_expert_bytes(stage, b);
      if (bytes >= options.bucket_bytes || b == blocks.begin) {
        out.push_back({b, end});
        end = b;
        bytes = 0;
      }
    }
    return out;
  }

  void add_compute(RankSchedule* rs, const ComputeItem& item, bool last_backward_of_chunk) const {
    const int s = rs->stage;
    const PlanStage& st = plan.stages[s];
    const LayerRange& blocks = st.chunks[item.chunk];
    const int vs = item.chunk * p + s;
    const int num_virtual = p * v;
    int64_t begin = sample_begin(s, item.micro_batch, rs->dp_rank);
    int64_t end = begin + replica_samples(s, rs->dp_rank);
    if (!st.replicas.empty()) {
      const PlanReplica& replica = st.replicas[static_cast<size_t>(rs->dp_rank)];
      for (int k = 0; k < item.piece; ++k) begin += replica.piece_sequences(k);
      end = begin + replica.piece_sequences(item.piece);
    }
    const int64_t offloaded = offloaded_bytes(s, rs->dp_rank, blocks);
    const bool sharded_gathers = st.zero == 3 && st.dp > 1;

    if (item.forward && vs > 0)
      add_transfers(rs, false, false, (vs - 1) % p, s, item.micro_batch, item.chunk, vs - 1);
    if (!item.forward && vs + 1 < num_virtual)
      add_transfers(rs, false, true, (vs + 1) % p, s, item.micro_batch, item.chunk, vs);
    if (sharded_gathers) {
      rs->ops.push_back(with_experts(step_op(OpKind::OpKind_all_gather, item.chunk, blocks,
                                             schedule_parameter_bytes(plan, model, s, blocks.begin, blocks.end)),
                                     *rs, precision_bytes(plan.precision)));
      rs->ops.back().micro_batch = item.micro_batch;
    }
    // Weights come in before every pass, parked activations before the backward.
    const int64_t parked = parked_bytes(s, blocks);
    const int64_t fetched = offloaded + (item.forward ? 0 : parked);
    if (fetched > 0) {
      rs->ops.push_back(step_op(OpKind::OpKind_prefetch, item.chunk, blocks, fetched));
      rs->ops.back().micro_batch = item.micro_batch;
    }

    ScheduleOp compute = step_op(item.forward ? OpKind::OpKind_forward : OpKind::OpKind_backward, item.chunk, blocks, 0);
    compute.micro_batch = item.micro_batch;
    compute.sample_begin = begin;
    compute.sample_end = end;
    // Sharded gradients leave each micro-batch's backward bucket by bucket; accumulated ones
    // only the last.
    if (!item.forward && (last_backward_of_chunk || st.gradients_sharded()) && st.dp > 1) {
      const OpKind reduce = st.zero == 0 || st.zero == 1 ? OpKind::OpKind_all_reduce : OpKind::OpKind_reduce_scatter;
      const std::vector<LayerRange> pieces = buckets(s, blocks);
      for (size_t k = 0; k < pieces.size(); ++k) {
        ScheduleOp piece = compute;
        piece.block_begin = pieces[k].begin;
        piece.block_end = pieces[k].end;
        piece.bucket = static_cast<int>(k);
        rs->ops.push_back(piece);
        const int wire = reduce == OpKind::OpKind_all_reduce ? plan.gradient_bytes : plan.reduce_scatter_bytes;
        ScheduleOp r = step_op(reduce, item.chunk, pieces[k],
                               schedule_gradient_bytes(plan, model, s, pieces[k].begin, pieces[k].end, wire));
        r.bucket = static_cast<int>(k);
        rs->ops.push_back(with_experts(r, *rs, wire));
      }
    } else {
      rs->ops.push_back(compute);
    }

    // Gradients go back after the backward, parked activations after the forward.
    if (offloaded > 0 || parked > 0) {
      ScheduleOp evict = step_op(OpKind::OpKind_evict, item.chunk, blocks, item.forward ? parked : offloaded);
      evict.micro_batch = item.micro_batch;
      rs->ops.push_back(evict);
    }
    if (item.forward && vs + 1 < num_virtual)
      add_transfers(rs, true, false, s, (vs + 1) % p, item.micro_batch, item.chunk, vs);
    if (!item.forward && vs > 0)
      add_transfers(rs, true, true, s, (vs - 1) % p, item.micro_batch, item.chunk, vs - 1);
  }
};

}  // namespace

const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::OpKind_forward: return "forward";
    case OpKind::OpKind_backward: return "backward";
    case OpKind::OpKind_send_activation: return "send_activation";
    case OpKind::OpKind_recv_activation: return "recv_activation";
    case OpKind::OpKind_send_gradient: return "send_gradient";
    case OpKind::OpKind_recv_gradient: return "recv_gradient";
    case OpKind::OpKind_all_reduce: return "all_reduce";
    case OpKind::OpKind_reduce_scatter: return "reduce_scatter";
    case OpKind::OpKind_all_gather: return "all_gather";
    case OpKind::OpKind_optimizer: return "optimizer";
    case OpKind::OpKind_prefetch: return "prefetch";
    case OpKind::OpKind_evict: return "evict";
  }
  return "?";
}

bool op_kind_is_compute(OpKind kind) {
  return kind == OpKind::OpKind_forward || kind == OpKind::OpKind_backward || kind == OpKind::OpKind_optimizer;
}
bool op_kind_is_send(OpKind kind) {
  return kind == OpKind::OpKind_send_activation || kind == OpKind::OpKind_send_gradient;
}
bool op_kind_is_recv(OpKind kind) {
  return kind == OpKind::OpKind_recv_activation || kind == OpKind::OpKind_recv_gradient;
}
bool op_kind_is_collective(OpKind kind) {
  return kind == OpKind::OpKind_all_reduce || kind == OpKind::OpKind_reduce_scatter ||
         kind == OpKind::OpKind_all_gather;
}

int64_t schedule_expert_parameters(const ModelSpec& model) {
  return model_is_moe(model) ? 3 * model.hidden_size * model.moe.expert_ffn_hidden_size : 0;
}

int64_t schedule_parameter_bytes(const Plan& plan, const ModelSpec& model, int stage, int block_begin, int block_end) {
  return stage_parameter_count(plan, model, stage, block_begin, block_end) * precision_bytes(plan.precision);
}

int64_t schedule_gradient_bytes(const Plan& plan, const ModelSpec& model, int stage, int block_begin, int block_end,
                                int element_bytes) {
  return stage_parameter_count(plan, model, stage, block_begin, block_end) * element_bytes;
}

int64_t schedule_offloaded_block_bytes(const Plan& plan, const ModelSpec& model, int stage, int dp_rank, int block,
                                       int element_bytes) {
  return stage_parameter_count(plan, model, stage, block, block + 1, false) * element_bytes +
         schedule_expert_bytes(plan, model, stage, dp_rank, block, block + 1, element_bytes);
}

int64_t schedule_expert_bytes(const Plan& plan, const ModelSpec& model, int stage, int dp_rank, int block_begin,
                              int block_end, int element_bytes) {
  const PlanStage& st = plan.stages[stage];
  if (st.ep <= 1) return 0;
  return moe_blocks_in(model, block_begin, block_end) * member_expert_count(st, model, dp_rank) *
         schedule_expert_parameters(model) * element_bytes;
}

RankSchedule schedule_build_rank(const Plan& plan, const ModelSpec& model, int rank, const ScheduleOptions& options) {
  Builder b{plan, model, options, {}, static_cast<int>(plan.stages.size()), plan.virtual_chunks,
            plan.seq_len * model.hidden_size * precision_bytes(plan.precision)};
  int next = 0;
  for (const PlanStage& st : plan.stages) {
    b.first_rank.push_back(next);
    next += st.tp * st.dp;
  }
  if (rank < 0 || rank >= next)
    throw Error(fmt::format("rank {} is outside the plan's 0..{}", rank, next - 1), {"", "rank"},
                "ranks number the devices the plan uses, stages in pipeline order");
  RankSchedule rs;
  rs.rank = rank;
  rs.stage = static_cast<int>(std::upper_bound(b.first_rank.begin(), b.first_rank.end(), rank) - b.first_rank.begin()) - 1;
  const PlanStage& st = plan.stages[rs.stage];
  const int local = rank - b.first_rank[rs.stage];
  rs.tp_rank = local % st.tp;
  rs.dp_rank = local / st.tp;
  rs.device_id = st.device_ids[local];

  const int pieces = st.replicas.empty() ? 1 : st.replicas[static_cast<size_t>(rs.dp_rank)].pieces;
  const std::vector<ComputeItem> items = split_into_pieces(
      compute_order(plan.schedule, b.p, rs.stage, plan.num_micro_batches, plan.virtual_chunks), pieces);
  std::vector<int> last_backward(plan.virtual_chunks, -1);
  for (size_t i = 0; i < items.size(); ++i)
    if (!items[i].forward) last_backward[items[i].chunk] = static_cast<int>(i);
  for (size_t i = 0; i < items.size(); ++i)
    b.add_compute(&rs, items[i], last_backward[items[i].chunk] == static_cast<int>(i));

  const LayerRange all_blocks{st.chunks.front().begin, st.chunks.back().end};
  rs.ops.push_back(b.step_op(OpKind::OpKind_optimizer, 0, all_blocks, 0));
  if ((st.zero == 1 || st.zero == 2) && st.dp > 1)
    for (int c = 0; c < plan.virtual_chunks; ++c)
      rs.ops.push_back(b.with_experts(
          b.step_op(OpKind::OpKind_all_gather, c, st.chunks[c],
                    schedule_parameter_bytes(plan, model, rs.stage, st.chunks[c].begin, st.chunks[c].end)),
          rs, precision_bytes(plan.precision)));
  return rs;
}

StepSchedule schedule_build(const Plan& plan, const ModelSpec& model, const ScheduleOptions& options) {
  StepSchedule out;
  out.schedule = plan.schedule;
  out.num_stages = static_cast<int>(plan.stages.size());
  out.virtual_chunks = plan.virtual_chunks;
  out.num_micro_batches = plan.num_micro_batches;
  const int ranks = plan.num_used_devices();
  out.ranks.reserve(ranks);
  for (int r = 0; r < ranks; ++r) out.ranks.push_back(schedule_build_rank(plan, model, r, options));
  return out;
}

std::string schedule_op_describe(const ScheduleOp& op) {
  std::string text = op_kind_name(op.kind);
  if (op.micro_batch >= 0) text += fmt::format(" mb {}", op.micro_batch);
  text += fmt::format(" chunk {}", op.chunk);
  if (op_kind_is_send(op.kind)) text += fmt::format(" to rank {} tag {}", op.peer, op.tag);
  if (op_kind_is_recv(op.kind)) text += fmt::format(" from rank {} tag {}", op.peer, op.tag);
  if (!op_kind_is_send(op.kind) && !op_kind_is_recv(op.kind))
    text += fmt::format(" blocks [{}, {})", op.block_begin, op.block_end);
  if (op.bucket >= 0) text += fmt::format(" bucket {}", op.bucket);
  if (op.bytes > 0) text += fmt::format(" ({:.1f} MiB)", static_cast<double>(op.bytes) / (1024.0 * 1024.0));
  if (op.sample_end > op.sample_begin) text += fmt::format(" samples [{}, {})", op.sample_begin, op.sample_end);
  return text;
}

}  // namespace alloy
