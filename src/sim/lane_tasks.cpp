// The simulator's tasks for one lane's schedule: passes (split at offloaded blocks, each fetched
// from host memory and its gradients written back as the runtime's offload engine does),
// transfers, collectives (a ZeRO-3 pass gathering its first block alone and the rest a block
// ahead), copies of parked activations and the optimizer step.
#include <algorithm>

#include "sim/simulator.hpp"

namespace alloy {

namespace {

double stage_memory_term(const PlanStage& st, const char* name) {
  for (const MemoryTerm& t : st.memory)
    if (t.name == name) return t.bytes;
  return 0;
}

// The evict that closes the pass whose compute op is `i` (`i` when the pass has none).
size_t pass_evict_op(const RankSchedule& rs, size_t i) {
  for (size_t j = i + 1; j < rs.ops.size(); ++j) {
    if (rs.ops[j].kind == OpKind::OpKind_evict) return j;
    if (rs.ops[j].kind == OpKind::OpKind_prefetch) break;
  }
  return i;
}

// Whether the compute op before op `i` is a forward.
bool follows_forward(const RankSchedule& rs, size_t i) {
  for (size_t j = i; j-- > 0;) {
    if (rs.ops[j].kind == OpKind::OpKind_forward) return true;
    if (rs.ops[j].kind == OpKind::OpKind_backward) return false;
  }
  return false;
}

}  // namespace

int Simulator::add_task(int lane, size_t op_index, OpKind kind, SimStream stream, double seconds) {
  const int id = static_cast<int>(tasks_.size());
  tasks_.emplace_back();
  SimTask& t = tasks_.back();
  t.lane = lane;
  t.op_index = static_cast<int>(op_index);
  t.kind = kind;
  t.stream = stream;
  t.duration_seconds = t.remaining_seconds = seconds;
  return id;
}

// Blocks [begin, end) weighted by kind: an MoE model's leading dense blocks take `dense` of an
// MoE block (the stage's times and activations split over its blocks so).
double Simulator::block_weight(int begin, int end, double dense) const {
  const int dense_blocks = model_is_moe(model_) ? static_cast<int>(model_.moe.first_dense_layers) : 0;
  const int dense_in = std::clamp(dense_blocks, begin, end) - begin;
  return (end - begin - dense_in) + dense_in * dense;
}

double Simulator::copy_seconds(int lane, int64_t bytes) const {
  const double host_link = cluster_.node_group(cluster_.devices[lanes_[lane].device_id]).host_link_bytes_per_second;
  return host_link > 0 ? static_cast<double>(bytes) / host_link : 0;
}

// The op's compute: the stage's time per micro-batch less what runs here as tasks of its own
// (boundary sends, the passes' first ZeRO-3 gathers, the host copies the cost model found
// exposed), times the op's share: its blocks', and for a replica whose share runs in pieces, its
// piece's sequences.
double Simulator::pass_seconds(int lane, const ScheduleOp& op) const {
  const PlanStage& st = plan_.stages[lane];
  const SimBlockCosts& costs = block_costs_[static_cast<size_t>(lane)];
  const bool backward = op.kind == OpKind::OpKind_backward;
  const double dense = backward ? costs.dense_backward : costs.dense_forward;
  const double per_micro_batch =
      backward ? st.backward_seconds - st.first_gather_backward_seconds -
                     (st.offload_exposed_seconds - st.offload_exposed_forward_seconds)
               : st.forward_seconds - st.first_gather_forward_seconds - st.offload_exposed_forward_seconds;
  double stage_weight = 0;
  for (const LayerRange& c : st.chunks) stage_weight += block_weight(c.begin, c.end, dense);
  return std::max(0.0, per_micro_batch - st.boundary_send_seconds) * block_weight(op.block_begin, op.block_end, dense) /
         std::max(stage_weight, 1e-30) * op_samples(lane, op);
}

double Simulator::op_samples(int lane, const ScheduleOp& op) const {
  if (op.sample_end <= op.sample_begin) return 1;
  return static_cast<double>(op.sample_end - op.sample_begin) /
         plan_.stages[lane].replica_sequences(plan_.micro_batch_sequences, lanes_[lane].dp_rank);
}

int Simulator::add_compute_piece(int lane, size_t i, double seconds, SimLaneCursor* c) {
  const int id = add_task(lane, i, lanes_[lane].ops[i].kind, SimStream::SimStream_compute, seconds);
  add_dep(id, c->last_compute);
  for (int in : c->pending_inputs) add_dep(id, in);
  c->pending_inputs.clear();
  c->last_compute = id;
  return id;
}

// The runtime's LayerOffload: a fetch thread copies one use after another into the slot that
// the use `slots` before frees (after a forward when it ends, after a backward when its
// gradients are home), and a backward's accumulated gradients only once the block's previous
// write-back landed; the block computes once its copy is in; a backward's gradients go back on
// a write-back thread.
int Simulator::add_offloaded_block(int lane, size_t i, size_t use, double seconds, SimLaneCursor* c) {
  const SimOffloadUse& u = offload_uses_[static_cast<size_t>(lane)][use];
  const size_t fetch_op = c->pass_prefetch >= 0 ? static_cast<size_t>(c->pass_prefetch) : i;
  const int fetch = add_task(lane, fetch_op, OpKind::OpKind_prefetch, SimStream::SimStream_copy, copy_seconds(lane, u.fetch_bytes));
  tasks_[fetch].resources.assign({lane * kNumResources + kHostIn});
  add_dep(fetch, c->last_fetch);
  const size_t slots = static_cast<size_t>(sim_offload_slots(plan_.stages[lane]));
  if (use >= slots) add_dep(fetch, c->use_free[use - slots]);
  if (u.previous_backward >= 0) add_dep(fetch, c->use_free[static_cast<size_t>(u.previous_backward)]);
  c->last_fetch = fetch;
  c->pending_inputs.push_back(fetch);
  const int piece = add_compute_piece(lane, i, seconds, c);
  c->use_free.push_back(piece);
  if (u.backward) {
    const int back = add_task(lane, pass_evict_op(lanes_[lane], i), OpKind::OpKind_evict, SimStream::SimStream_copy_out,
                              copy_seconds(lane, u.write_back_bytes));
    tasks_[back].resources.assign({lane * kNumResources + kHostOut});
    add_dep(back, piece);
    add_dep(back, c->last_copy_out);
    c->last_copy_out = back;
    c->use_free.back() = back;
  }
  return piece;
}

// A forward or backward op: its blocks in the order it runs them, a run of resident blocks as
// one piece and each offloaded block as a piece of its own behind its fetch.
int Simulator::add_pass(int lane, size_t i, SimLaneCursor* c) {
  const ScheduleOp& op = lanes_[lane].ops[i];
  const PlanStage& st = plan_.stages[lane];
  const SimBlockCosts& costs = block_costs_[static_cast<size_t>(lane)];
  const std::vector<SimOffloadUse>& uses = offload_uses_[static_cast<size_t>(lane)];
  const bool backward = op.kind == OpKind::OpKind_backward;
  const double dense = backward ? costs.dense_backward : costs.dense_forward;
  double seconds = pass_seconds(lane, op);
  // MoE blocks dispatch and combine their tokens inside the pass: shown apart, after it.
  const double all_to_all =
      std::min(seconds, costs.all_to_all_seconds * block_weight(op.block_begin, op.block_end, 0) * op_samples(lane, op));
  seconds -= all_to_all;
  const double op_weight = std::max(block_weight(op.block_begin, op.block_end, dense), 1e-30);
  // Blocks [k0, k1) in the pass's order.
  const auto piece_seconds = [&](int k0, int k1) {
    const int begin = backward ? op.block_end - k1 : op.block_begin + k0;
    return seconds * block_weight(begin, begin + (k1 - k0), dense) / op_weight;
  };
  const int before = c->last_compute;
  const int blocks = op.block_end - op.block_begin;
  int first = -1;
  int run_begin = 0;  // the first block of the resident run being collected
  for (int k = 0; k <= blocks; ++k) {
    const int block = backward ? op.block_end - 1 - k : op.block_begin + k;
    const bool offloaded = k < blocks && c->next_use < uses.size() &&
                           uses[c->next_use].op_index == static_cast<int>(i) && uses[c->next_use].block == block;
    if (k < blocks && !offloaded) continue;
    if (run_begin < k) {
      const int piece = add_compute_piece(lane, i, piece_seconds(run_begin, k), c);
      if (first < 0) first = piece;
    }
    if (offloaded) {
      const int piece = add_offloaded_block(lane, i, c->next_use++, piece_seconds(k, k + 1), c);
      if (first < 0) first = piece;
    }
    run_begin = k + 1;
  }
  const int last = c->last_compute;
  // Activations live from the chunk's forward until its backward's last block.
  const double in_flight = st.micro_batches_in_flight > 0 ? st.micro_batches_in_flight : 0;
  const double activation_per_mb = in_flight > 0 ? stage_memory_term(st, "activations") / in_flight : 0;
  double activation_total = 0;
  for (const LayerRange& r : st.chunks) activation_total += block_weight(r.begin, r.end, costs.dense_activations);
  const LayerRange& chunk = st.chunks[op.chunk];
  const double act = activation_per_mb * block_weight(chunk.begin, chunk.end, costs.dense_activations) /
                     std::max(activation_total, 1e-30);
  if (!backward) {
    tasks_[first].alloc_bytes += act;
    c->activation_owner[{op.micro_batch, op.chunk}] = first;
  }
  if (backward && op.block_begin == chunk.begin) tasks_[c->activation_owner[{op.micro_batch, op.chunk}]].frees.emplace_back(last, act);
  if (all_to_all > 0) {
    const int exchange = add_task(lane, i, op.kind, SimStream::SimStream_all_to_all, all_to_all);
    add_dep(exchange, last);
    c->last_compute = exchange;  // the next pass and the sends wait for the combined output
  }
  c->before_last_compute = before;
  return first;
}

// The plan's optimizer time holds the stage's last write-back (the cost model's wait for it);
// here the optimizer waits for the write-back task itself instead.
int Simulator::add_optimizer(int lane, size_t i, SimLaneCursor* c) {
  const int before = c->last_compute;
  const std::vector<SimOffloadUse>& uses = offload_uses_[static_cast<size_t>(lane)];
  const auto last_backward =
      std::find_if(uses.rbegin(), uses.rend(), [](const SimOffloadUse& u) { return u.backward; });
  const double last_write_back =
      last_backward != uses.rend() ? copy_seconds(lane, last_backward->write_back_bytes) : 0.0;
  const double seconds =
      std::max(0.0, plan_.stages[lane].optimizer_seconds - last_write_back) + tied_table_seconds(lane);
  const int id = add_compute_piece(lane, i, seconds, c);
  add_dep(id, c->last_collective);
  add_dep(id, c->last_fetch);
  add_dep(id, c->last_copy_out);
  c->before_last_compute = before;
  return id;
}

// ZeRO 3 gathers a pass's weights inside it (zero3.cpp): its first block when it starts, alone;
// each next one a block ahead, under the compute (add_gathers_ahead). A reduction of offloaded
// blocks waits for their gradients to be home.
int Simulator::add_collective(int lane, size_t i, SimLaneCursor* c) {
  const ScheduleOp& op = lanes_[lane].ops[i];
  const bool pass_gather = op.kind == OpKind::OpKind_all_gather && op.micro_batch >= 0;
  if (pass_gather) c->first_gathered = sim_zero3_first_block(lanes_[lane], i, plan_.stages[lane]);
  const int id = add_task(lane, i, op.kind, SimStream::SimStream_collective, 0);
  SimTask& t = tasks_[id];
  t.duration_seconds = t.remaining_seconds = collective_alone_seconds(
      lane, pass_gather ? zero3_gather_op(lane, op, c->first_gathered, c->first_gathered + 1) : op, &t.resources, &t.links);
  add_dep(id, c->last_collective);
  add_dep(id, c->last_recv);
  add_dep(id, c->last_compute);
  if (op.kind != OpKind::OpKind_all_gather &&
      sim_offloaded_weight_bytes(plan_, model_, lane, lanes_[lane].dp_rank, op.block_begin, op.block_end) > 0)
    add_dep(id, c->last_copy_out);
  if (pass_gather) c->pending_inputs.push_back(id);
  c->last_collective = id;
  return id;
}

// After a ZeRO-3 pass op: the pass's first resident block came alone (a forward's blocks before
// it are offloaded); the op's other blocks come a block ahead of their use.
void Simulator::add_gathers_ahead(int lane, size_t i, SimLaneCursor* c) {
  const ScheduleOp& op = lanes_[lane].ops[i];
  int begin = op.block_begin, end = op.block_end;
  if (c->first_gathered >= begin && c->first_gathered < end) {
    if (op.kind == OpKind::OpKind_forward) {
      begin = c->first_gathered + 1;
    } else {
      end = c->first_gathered;
    }
  }
  c->first_gathered = -1;
  if (begin >= end) return;
  const int ahead = add_task(lane, i, OpKind::OpKind_all_gather, SimStream::SimStream_collective, 0);
  SimTask& g = tasks_[ahead];
  g.duration_seconds = g.remaining_seconds =
      collective_alone_seconds(lane, zero3_gather_op(lane, op, begin, end), &g.resources, &g.links);
  add_dep(ahead, c->last_collective);
  add_dep(ahead, c->before_last_compute);
  c->last_collective = ahead;
  c->pending_inputs.push_back(ahead);  // the next compute waits for this one's weights
}

// What a prefetch or evict op holds besides offloaded weights (which move block by block with
// their passes): a backward's parked activations coming in before it, a forward's going out
// after it. None: no task.
int Simulator::add_activation_copy(int lane, size_t i, SimLaneCursor* c) {
  const ScheduleOp& op = lanes_[lane].ops[i];
  const bool in = op.kind == OpKind::OpKind_prefetch;
  if (in) c->pass_prefetch = static_cast<int>(i);
  const int64_t bytes =
      in ? op.bytes - sim_offloaded_weight_bytes(plan_, model_, lane, lanes_[lane].dp_rank, op.block_begin, op.block_end)
         : (follows_forward(lanes_[lane], i) ? op.bytes : 0);
  if (bytes <= 0) return -1;
  const int id = add_task(lane, i, op.kind, in ? SimStream::SimStream_copy : SimStream::SimStream_copy_out,
                          copy_seconds(lane, bytes));
  tasks_[id].resources.assign({lane * kNumResources + (in ? kHostIn : kHostOut)});
  if (in) {
    add_dep(id, c->before_last_compute);
    add_dep(id, c->last_recv);
    c->pending_inputs.push_back(id);
  } else {
    add_dep(id, c->last_compute);
    add_dep(id, c->last_copy_out);
    c->last_copy_out = id;
  }
  return id;
}

void Simulator::build_lane(int lane) {
  const RankSchedule& rs = lanes_[lane];
  const PlanStage& st = plan_.stages[lane];
  offload_uses_[static_cast<size_t>(lane)] = sim_offload_uses(plan_, model_, rs);
  const bool gathers = st.zero == 3 && st.dp > 1;
  SimLaneCursor c;
  for (size_t i = 0; i < rs.ops.size(); ++i) {
    const ScheduleOp& op = rs.ops[i];
    int first = -1;
    switch (op.kind) {
      case OpKind::OpKind_forward:
      case OpKind::OpKind_backward:
        first = add_pass(lane, i, &c);
        if (gathers) add_gathers_ahead(lane, i, &c);
        break;
      case OpKind::OpKind_optimizer:
        first = add_optimizer(lane, i, &c);
        break;
      case OpKind::OpKind_send_activation:
      case OpKind::OpKind_send_gradient: {
        first = add_task(lane, i, op.kind, SimStream::SimStream_send, 0);
        SimTask& t = tasks_[first];
        t.duration_seconds = t.remaining_seconds = transfer_seconds(lane, op, &t.resources, &t.links);
        add_dep(first, c.last_compute);
        add_dep(first, c.last_recv);
        sends_by_tag_[{lane, op.tag, static_cast<int>(op.kind)}].push_back(first);
        break;
      }
      case OpKind::OpKind_recv_activation:
      case OpKind::OpKind_recv_gradient:
        first = add_task(lane, i, op.kind, SimStream::SimStream_recv, 0);
        c.pending_inputs.push_back(first);
        c.last_recv = first;
        break;
      case OpKind::OpKind_all_reduce:
      case OpKind::OpKind_reduce_scatter:
      case OpKind::OpKind_all_gather:
        first = add_collective(lane, i, &c);
        break;
      case OpKind::OpKind_prefetch:
      case OpKind::OpKind_evict:
        first = add_activation_copy(lane, i, &c);
        break;
    }
    op_task_[lane].push_back(first);
  }
  // Model states, buffers and context stay resident (the ZeRO-3 gather buffer and the offload
  // window are reused by every gather and prefetch, as the cost model counts them); activations
  // come and go with the micro-batches.
  static_bytes_[lane] = st.memory_total_bytes() - stage_memory_term(st, "activations");
}

}  // namespace alloy
