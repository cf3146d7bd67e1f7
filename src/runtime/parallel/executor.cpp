// The rank executor: walks the rank's schedule op by op. Sends and collectives are posted and
// complete in the communicator's progress thread; a receive is waited for when its data is
// first needed; gradient buckets are reduced while the rest of the backward runs.
#include "runtime/parallel/executor.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "runtime/cpu/optimizer.hpp"
#include "runtime/device_speed.hpp"
#include "runtime/parallel/expert_parallel.hpp"
#include "spec/error.hpp"

namespace alloy {

// Tensor-parallel sums of the model's passes, blocking, on the rank's tp group.
class CommTensorParallel : public TensorParallelOps {
 public:
  CommTensorParallel(Communicator& comm, const CommGroup& group) : comm_(comm), group_(group) {}
  void all_reduce_sum(float* data, int64_t count) override { timed(comm_.all_reduce(data, count, group_)); }
  void all_reduce_max(float* data, int64_t count) override {
    timed(comm_.all_reduce(data, count, group_, ReduceOp::ReduceOp_max));
  }
  void all_gather(float* data, int64_t piece) override {
    timed(comm_.all_gather(data, std::vector<int64_t>(static_cast<size_t>(group_.size()), piece), group_));
  }
  void reduce_scatter(float* data, int64_t piece) override {
    timed(comm_.reduce_scatter(data, std::vector<int64_t>(static_cast<size_t>(group_.size()), piece), group_));
  }
  double take_wait_seconds() { return std::exchange(wait_seconds_, 0.0); }

 private:
  void timed(const CommHandle& handle) {
    wait_seconds_ += compute_wait([&] { handle.wait(); });
  }
  Communicator& comm_;
  CommGroup group_;
  double wait_seconds_ = 0;
};

// Under ZeRO 3 with offload: ZeRO 3 gathers the device's units, the offload engine fetches the
// offloaded blocks; each ignores the other's units.
class BothParameterSources : public ParameterSource {
 public:
  BothParameterSources(ParameterSource& gathered, ParameterSource& fetched) : gathered_(gathered), fetched_(fetched) {}
  void acquire(int unit, bool backward) override {
    gathered_.acquire(unit, backward);
    fetched_.acquire(unit, backward);
  }
  void release(int unit, bool backward) override {
    fetched_.release(unit, backward);
    gathered_.release(unit, backward);
  }

 private:
  ParameterSource& gathered_;
  ParameterSource& fetched_;
};

struct RankRuntime::PassSlot {
  int micro_batch = 0;
  int chunk = 0;
  std::unique_ptr<StagePass> pass;
  int64_t sample_begin = 0;     // the replica's first global sample of the micro-batch
  const void* output = nullptr;          // forward output (B, T, C) while sends are in flight
  const void* input_gradient = nullptr;  // backward result to send
  std::vector<CommHandle> receives;
  std::vector<CommHandle> sends;
  bool balance_pooled = false;  // given its micro-batch's pooled load-balancing sums
  bool finished = false;        // backward done; released once its sends complete
};

namespace {

// This rank's forward ops per micro-batch of the step.
std::vector<int> forwards_per_micro_batch(const Plan& plan, const RankSchedule& schedule) {
  std::vector<int> forwards(static_cast<size_t>(plan.num_micro_batches), 0);
  for (const ScheduleOp& op : schedule.ops)
    if (op.kind == OpKind::OpKind_forward) forwards.at(static_cast<size_t>(op.micro_batch))++;
  return forwards;
}

std::vector<int> stage_first_ranks(const Plan& plan) {
  std::vector<int> first;
  int next = 0;
  for (const PlanStage& st : plan.stages) {
    first.push_back(next);
    next += st.tp * st.dp;
  }
  return first;
}

double clock_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

ModelShard rank_shard(const Plan& plan, int stage_index, int tp_rank, int dp_rank) {
  const PlanStage& stage = plan.stages[stage_index];
  ModelShard shard;
  for (const LayerRange& c : stage.chunks) shard.block_ranges.push_back({c.begin, c.end});
  std::sort(shard.block_ranges.begin(), shard.block_ranges.end());
  shard.has_embedding = stage.has_embedding;
  shard.has_head = stage.has_head;
  shard.tp = stage.tp;
  shard.tp_rank = tp_rank;
  shard.sequence_parallel = stage.sequence_parallel;
  shard.ep = stage.ep;
  shard.ep_rank = dp_rank % stage.ep;
  shard.experts_per_member = stage.experts_per_member;
  return shard;
}

RankGroups rank_groups_build(const Plan& plan, const ModelSpec& model, Communicator& comm) {
  const std::vector<int> first = stage_first_ranks(plan);
  std::vector<std::vector<int>> tp_groups, dp_groups, embedding_groups;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const PlanStage& st = plan.stages[s];
    for (int d = 0; d < st.dp; ++d) {
      tp_groups.emplace_back();
      for (int t = 0; t < st.tp; ++t) tp_groups.back().push_back(first[s] + d * st.tp + t);
    }
    for (int t = 0; t < st.tp; ++t) {
      dp_groups.emplace_back();
      for (int d = 0; d < st.dp; ++d) dp_groups.back().push_back(first[s] + d * st.tp + t);
    }
  }
  if (model.tied_embeddings && plan.stages.size() > 1) {
    const PlanStage& head = plan.stages.back();
    const PlanStage& embed = plan.stages.front();
    if (embed.tp == head.tp) {  // the same vocabulary rows on tp rank t of both stages
      for (int t = 0; t < embed.tp; ++t) {
        embedding_groups.emplace_back();
        for (int d = 0; d < embed.dp; ++d) embedding_groups.back().push_back(d * embed.tp + t);
        for (int d = 0; d < head.dp; ++d) embedding_groups.back().push_back(first.back() + d * head.tp + t);
      }
    } else {  // different row splits: one group sums whole tables
      embedding_groups.emplace_back();
      for (int r = 0; r < embed.tp * embed.dp; ++r) embedding_groups.back().push_back(r);
      for (int r = 0; r < head.tp * head.dp; ++r) embedding_groups.back().push_back(first.back() + r);
    }
  }
  RankGroups groups;
  groups.tp = comm.split(tp_groups);
  groups.dp = comm.split(dp_groups);
  groups.embedding = comm.split(embedding_groups);
  if (model_is_moe(model)) {  // the same answer on every rank: all split, or none
    groups.ep = comm.split(expert_groups_partition(plan, plan_ep_group));
    groups.expert_dp = comm.split(expert_groups_partition(plan, plan_expert_dp_group));
  }
  if (model_balance_is_pooled(model)) {
    std::vector<int> all(static_cast<size_t>(plan.num_used_devices()));
    for (int rank = 0; rank < plan.num_used_devices(); ++rank) all[static_cast<size_t>(rank)] = rank;
    groups.balance = comm.split({all});
  }
  return groups;
}

RankRuntime::RankRuntime(const Plan& plan, const ModelSpec& spec, const TrainSpec& train, Communicator& comm,
                         const RankResources& resources, Communicator* control)
    : plan_(plan),
      train_(train),
      comm_(comm),
      control_(control != nullptr ? *control : comm),
      slowdown_(std::max(1.0, resources.slowdown)) {
  ScheduleOptions schedule_options;
  schedule_options.bucket_bytes = plan.gradient_bucket_bytes;
  schedule_ = schedule_build_rank(plan, spec, comm.rank(), schedule_options);
  groups_ = rank_groups_build(plan, spec, comm);
  const bool control_apart = &control_ != &comm;  // the same on every rank: all split, or none
  control_groups_ = control_apart && model_is_moe(spec) ? rank_groups_build(plan, spec, control_) : groups_;
  for (const ScheduleOp& op : schedule_.ops)
    if (op.kind == OpKind::OpKind_send_gradient) gradient_sends_[{op.micro_batch, op.chunk}]++;
  const PlanStage& stage = plan.stages[schedule_.stage];
  HostPlacement host;
  host.blocks = stage.layer_flags(stage.offload, spec.num_layers);
  const std::vector<bool> activations = stage.layer_flags(stage.offload_activations, spec.num_layers);
  const bool offloads = flags_any(host.blocks);
  if (offloads || flags_any(activations)) {
    host_arena_ = std::make_unique<Arena>(static_cast<int64_t>(resources.host_memory_bytes), "the host of " + stage.device_type);
    host.arena = host_arena_.get();
    host_link_ = std::make_unique<HostLink>(resources.host_link_bytes_per_second);
  }
  StageRequest request;
  request.model = &spec;
  request.shard = rank_shard(plan, schedule_.stage, schedule_.tp_rank, schedule_.dp_rank);
  request.host = host;
  request.memory_cap_bytes = resources.memory_cap_bytes;
  request.device_name = stage.device_type;
  request.seed = train.seed;
  backend_ = resources.backend ? resources.backend(request) : stage_backend_cpu(request);
  loss_scaler_ = LossScaler::from(train, backend_->computes_in_fp16());
  Model& model = backend_->model();
  model.layer_cpu_seconds = &layer_cpu_seconds_;
  if (stage.tp > 1) {
    tp_ops_ = std::make_unique<CommTensorParallel>(comm, groups_.tp);
    model.tp_ops = tp_ops_.get();
  }
  if (model_is_moe(spec) && stage.dp > 1) {
    moe_exchange_ = std::make_unique<CommMoeExchange>(comm, groups_.ep, control_, control_groups_.dp,
                                                      control_groups_.ep);
    model.moe_exchange = moe_exchange_.get();
  }
  if (model_balance_is_pooled(spec)) {
    balance_pool_ = std::make_unique<BalancePool>(control_, control_groups_.balance, schedule_.tp_rank == 0,
                                                  forwards_per_micro_batch(plan, schedule_),
                                                  2 * spec.moe.num_experts + 1);
  }
  int local = 0;
  for (const LayerRange& c : stage.chunks)
    for (int b = c.begin; b < c.end; ++b) model.recompute[static_cast<size_t>(b)] = stage.recompute[local++];
  const bool tied_sync = spec.tied_embeddings && plan.stages.size() > 1 && (stage.has_embedding || stage.has_head);
  layout_ = param_layout_build(plan, model, schedule_, tied_sync);
  // ZeRO 3 and offload move weights with host copies: backends whose memory is not the host's
  // refuse such plans (stage_backend_supports) before they get here.
  if (layout_.sharded && stage.zero == 3) zero3_ = std::make_unique<Zero3Parameters>(model, layout_, comm, groups_.dp, groups_.expert_dp);
  const bool bf16_wire = train.gradient_communication == Precision::Precision_bf16;
  if (stage.gradients_sharded())
    sharded_ = std::make_unique<ShardedGradients>(*backend_, layout_, comm, groups_.dp, groups_.expert_dp,
                                                  plan.gradient_bucket_bytes, bf16_wire);
  build_moments();
  if (offloads) {
    offload_ = std::make_unique<LayerOffload>(model, offload_uses_from_schedule(schedule_, host.blocks),
                                              stage.offload_prefetch_depth, *host_link_);
  }
  if (zero3_ && offload_) {
    both_sources_ = std::make_unique<BothParameterSources>(*zero3_, *offload_);
    model.parameter_source = both_sources_.get();
  }
  if (flags_any(activations)) {
    activation_offload_ = std::make_unique<ActivationOffload>(model, activations, stage.offload_prefetch_depth,
                                                              *host_link_, *host_arena_);
  }
}

RankRuntime::~RankRuntime() {
  for (auto& slot : passes_) backend_->pass_release(*slot->pass);
  if (both_sources_) backend_->model().parameter_source = nullptr;
  activation_offload_.reset();
  offload_.reset();
  for (MomentSegment& ms : moments_) {
    Arena& from = ms.on_host ? *host_arena_ : backend_->arena();
    from.release(ms.v);
    from.release(ms.m);
  }
}

void RankRuntime::record_offload_copies() {
  std::vector<OffloadCopy> copies = offload_ ? offload_->take_copies() : std::vector<OffloadCopy>{};
  if (activation_offload_)
    for (const OffloadCopy& c : activation_offload_->take_copies()) copies.push_back(c);
  for (const OffloadCopy& c : copies) {
    SimInterval iv;
    iv.stream = SimStream::SimStream_copy;
    iv.kind = c.to_device ? OpKind::OpKind_prefetch : OpKind::OpKind_evict;
    iv.op_index = c.use.op_index;
    iv.micro_batch = c.use.micro_batch;
    iv.chunk = c.use.chunk;
    iv.start_seconds = c.start_seconds - step_start_;
    iv.end_seconds = c.end_seconds - step_start_;
    intervals_.push_back(iv);
  }
}

const CommGroup& RankRuntime::bucket_group(const GradientBucket& bucket) const {
  return bucket.experts ? groups_.expert_dp : groups_.dp;
}

double RankRuntime::now() const { return clock_seconds() - step_start_; }

int RankRuntime::gradient_sends(int micro_batch, int chunk) const {
  auto it = gradient_sends_.find({micro_batch, chunk});
  return it == gradient_sends_.end() ? 0 : it->second;
}

int64_t RankRuntime::replica_begin(int micro_batch) const {
  const PlanStage& st = plan_.stages[schedule_.stage];
  return micro_batch * plan_.micro_batch_sequences + st.replica_offset(plan_.micro_batch_sequences, schedule_.dp_rank);
}

void RankRuntime::wait(const CommHandle& handle, RankStepStats& stats) {
  stats.wait_seconds += compute_wait([&] { handle.wait(); });
}

void RankRuntime::record(SimStream stream, const ScheduleOp& op, size_t index, double start, double end) {
  SimInterval iv;
  iv.stream = stream;
  iv.kind = op.kind;
  iv.op_index = static_cast<int>(index);
  iv.micro_batch = op.micro_batch;
  iv.chunk = op.chunk;
  iv.start_seconds = start;
  iv.end_seconds = end;
  intervals_.push_back(iv);
}

RankRuntime::PassSlot& RankRuntime::pass_for(const ScheduleOp& op, const int32_t* inputs, const int32_t* targets) {
  // A compute op names its samples (a piece of the replica's share, under uneven data
  // parallelism); a transfer names those it carries, part of the replica's share or all of it.
  const bool compute = op_kind_is_compute(op.kind);
  for (auto& slot : passes_)
    if (slot->micro_batch == op.micro_batch && slot->chunk == op.chunk && !slot->finished &&
        (!compute || slot->sample_begin == op.sample_begin))
      return *slot;
  const PlanStage& st = plan_.stages[schedule_.stage];
  const int p = static_cast<int>(plan_.stages.size());
  const int virtual_stage = op.chunk * p + schedule_.stage;
  auto slot = std::make_unique<PassSlot>();
  slot->micro_batch = op.micro_batch;
  slot->chunk = op.chunk;
  slot->sample_begin = compute ? op.sample_begin : replica_begin(op.micro_batch);
  const int T = static_cast<int>(plan_.seq_len);
  const int B = static_cast<int>(compute ? op.sample_end - op.sample_begin
                                         : st.replica_sequences(plan_.micro_batch_sequences, schedule_.dp_rank));
  const bool embeds = virtual_stage == 0;
  const bool heads = virtual_stage == p * plan_.virtual_chunks - 1;
  const LayerRange& blocks = st.chunks[op.chunk];
  slot->pass = backend_->pass_begin(blocks.begin, blocks.end, embeds, heads, inputs + slot->sample_begin * T,
                                    targets + slot->sample_begin * T, B, T);
  passes_.push_back(std::move(slot));
  return *passes_.back();
}

CommHandle RankRuntime::track(CommHandle handle, SimStream stream, const ScheduleOp& op, size_t index) {
  in_flight_.push_back({handle, stream, op, index, now()});
  return handle;
}

void RankRuntime::record_completed(bool all) {
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    if (!all && !it->handle.done()) {
      ++it;
      continue;
    }
    record(it->stream, it->op, it->index, it->start, now());
    it = in_flight_.erase(it);
  }
}

void RankRuntime::reap_finished_passes(bool wait_all, RankStepStats& stats) {
  for (auto it = passes_.begin(); it != passes_.end();) {
    PassSlot& slot = **it;
    bool ready = slot.finished && static_cast<int>(slot.sends.size()) == gradient_sends(slot.micro_batch, slot.chunk);
    for (const CommHandle& h : slot.sends) {
      if (!ready) break;
      if (wait_all) wait(h, stats);
      ready = h.done();
    }
    if (!ready) {
      ++it;
      continue;
    }
    backend_->pass_release(*slot.pass);
    it = passes_.erase(it);
  }
}

void RankRuntime::run_op(size_t index, const ScheduleOp& op, const int32_t* inputs, const int32_t* targets,
                         RankStepStats& stats) {
  // One sample's hidden state, in bytes as the backend holds it.
  const int64_t row_bytes = plan_.seq_len * backend_->model().spec.hidden_size * backend_->hidden_element_bytes();
  switch (op.kind) {
    case OpKind::OpKind_recv_activation:
    case OpKind::OpKind_recv_gradient: {
      PassSlot& slot = pass_for(op, inputs, targets);
      auto* base = static_cast<std::byte*>(op.kind == OpKind::OpKind_recv_activation
                                               ? backend_->pass_input(*slot.pass)
                                               : backend_->pass_output_gradient(*slot.pass));
      const int64_t offset = (op.sample_begin - slot.sample_begin) * row_bytes;
      const int64_t bytes = (op.sample_end - op.sample_begin) * row_bytes;
      slot.receives.push_back(track(comm_.recv(base + offset, bytes, op.peer, op.tag), SimStream::SimStream_recv, op, index));
      return;
    }
    case OpKind::OpKind_send_activation:
    case OpKind::OpKind_send_gradient: {
      PassSlot* found = nullptr;
      for (auto& slot : passes_)
        if (slot->micro_batch == op.micro_batch && slot->chunk == op.chunk &&
            slot->finished == (op.kind == OpKind::OpKind_send_gradient))
          found = slot.get();
      if (found == nullptr) throw Error(fmt::format("rank {}: {} has no pass to send from", comm_.rank(), schedule_op_describe(op)));
      const auto* base =
          static_cast<const std::byte*>(op.kind == OpKind::OpKind_send_activation ? found->output : found->input_gradient);
      const int64_t offset = (op.sample_begin - found->sample_begin) * row_bytes;
      const int64_t bytes = (op.sample_end - op.sample_begin) * row_bytes;
      found->sends.push_back(track(comm_.send(base + offset, bytes, op.peer, op.tag), SimStream::SimStream_send, op, index));
      return;
    }
    case OpKind::OpKind_forward:
    case OpKind::OpKind_backward: {
      PassSlot& slot = pass_for(op, inputs, targets);
      for (const CommHandle& h : slot.receives) wait(h, stats);
      slot.receives.clear();
      if (op.kind == OpKind::OpKind_backward && balance_pool_ && !slot.balance_pooled) {
        wait(balance_pool_->posted(op.micro_batch), stats);
        backend_->pass_balance_pool(*slot.pass, balance_pool_->pooled(op.micro_batch));
        slot.balance_pooled = true;
      }
      const double compute_start = now();
      ComputeStretch stretch(slowdown_);
      if (op.kind == OpKind::OpKind_forward) {
        slot.output = backend_->pass_forward(*slot.pass);
        if (slot.pass->heads && schedule_.tp_rank == 0) stats.loss_tokens += static_cast<double>(slot.pass->B) * slot.pass->T;
        if (balance_pool_) balance_pool_->forward_done(op.micro_batch, backend_->pass_balance_sums(*slot.pass));
      } else {
        for (const CommHandle& h : slot.sends) wait(h, stats);  // the outputs are freed below
        slot.sends.clear();
        // The pass's loss is its mean over its B sequences; scaled by B / global batch, every
        // sequence of the step weighs alike, however unevenly the replicas share micro-batches.
        // The micro-batch's share of the step's mean loss, times the loss scale (1 unless dynamic).
        const float loss_scale = static_cast<float>(slot.pass->B) / static_cast<float>(plan_.global_batch_sequences) *
                                 static_cast<float>(loss_scaler_.scale);
        if (sharded_ && op.bucket >= 0) sharded_->bind(op.chunk, op.bucket);
        slot.input_gradient = backend_->pass_backward(*slot.pass, op.block_begin, op.block_end, loss_scale);
        slot.finished = backend_->pass_finished(*slot.pass);
      }
      const double tp_wait = (tp_ops_ ? tp_ops_->take_wait_seconds() : 0.0) +
                             (zero3_ ? zero3_->take_wait_seconds() : 0.0) +
                             (offload_ ? offload_->take_wait_seconds() : 0.0) +
                             (activation_offload_ ? activation_offload_->take_wait_seconds() : 0.0) +
                             (sharded_ ? sharded_->take_wait_seconds() : 0.0) +
                             (moe_exchange_ ? moe_exchange_->take_wait_seconds() : 0.0);
      stretch.finish();
      const double end = now();
      stats.compute_seconds += end - compute_start - tp_wait;
      stats.wait_seconds += tp_wait;
      stats.pass_seconds += end - compute_start;
      record(SimStream::SimStream_compute, op, index, compute_start, end);
      memory_.push_back({end, static_cast<double>(backend_->arena().bytes_in_use())});
      return;
    }
    case OpKind::OpKind_all_reduce:
    case OpKind::OpKind_reduce_scatter: {
      if (sharded_) {  // completes into the shard (ShardedGradients::reap)
        track(sharded_->reduce_scatter(op.chunk, op.bucket), SimStream::SimStream_collective, op, index);
        return;
      }
      // Offloaded blocks' gradients are reduced in host memory, once their last write-back landed.
      if (offload_) {
        const double start = now();
        offload_->wait_gradients_home(op.block_begin, op.block_end);
        stats.wait_seconds += now() - start;
      }
      for (const GradientBucket& b : layout_.buckets) {
        if (b.chunk != op.chunk || b.bucket != op.bucket) continue;
        float* data = backend_->gradients_at(b.range.offset, b.range.count);
        CommHandle reduction;
        const CommGroup& group = bucket_group(b);
        if (op.kind == OpKind::OpKind_all_reduce) {
          reduction = comm_.all_reduce(data, b.range.count, group);
        } else if (train_.gradient_communication == Precision::Precision_bf16) {
          reduction = comm_.reduce_scatter_bf16(data, b.piece_counts, group);
        } else {
          reduction = comm_.reduce_scatter(data, b.piece_counts, group);
        }
        pending_reductions_.push_back(track(reduction, SimStream::SimStream_collective, op, index));
      }
      return;
    }
    case OpKind::OpKind_all_gather: {
      if (zero3_) return;  // ZeRO 3 gathers each block's weights inside the compute that uses them
      std::vector<CommHandle> handles;
      for (const GradientBucket& b : layout_.buckets)
        if (b.chunk == op.chunk)
          handles.push_back(track(comm_.all_gather(backend_->parameters_at(b.range.offset, b.range.count), b.piece_counts, bucket_group(b)),
                                  SimStream::SimStream_collective, op, index));
      if (op.micro_batch >= 0) {  // ZeRO 3: the weights are needed now
        for (const CommHandle& h : handles) wait(h, stats);
      } else {
        for (CommHandle& h : handles) pending_gathers_.push_back(std::move(h));
      }
      return;
    }
    case OpKind::OpKind_optimizer: {
      // A backend that queues its work (a GPU stream) may still be running the passes queued
      // above: that time is the passes', not the optimizer's (which would otherwise take it
      // when it first reads a value).
      const double drain_start = now();
      backend_->fence();
      const double drained = now() - drain_start;
      stats.pass_seconds += drained;
      stats.compute_seconds += drained;
      for (const CommHandle& h : pending_reductions_) wait(h, stats);
      pending_reductions_.clear();
      if (sharded_) {
        sharded_->reap(true);
        stats.wait_seconds += sharded_->take_wait_seconds();
      }
      if (zero3_) zero3_->drop_prefetched();  // gathered before the update: stale after it
      if (offload_) {  // the offloaded blocks' gradients must be back in host memory
        const double start = now();
        offload_->step_end();
        stats.wait_seconds += now() - start;
      }
      const double compute_start = now();
      ComputeStretch stretch(slowdown_);
      const double waited_before = stats.wait_seconds;
      optimizer(stats);
      if (zero3_ && offload_) gather_offloaded_parameters();
      const double waited = stats.wait_seconds - waited_before;  // the norm's and tied table's sums
      stretch.finish();
      const double end = now();
      stats.compute_seconds += end - compute_start - waited;
      stats.optimizer_seconds += end - compute_start - waited;
      record(SimStream::SimStream_compute, op, index, compute_start, end);
      return;
    }
    case OpKind::OpKind_prefetch:
    case OpKind::OpKind_evict:
      return;  // the offload engine copies block by block in the passes' order, ahead of them
  }
}

RankStepStats RankRuntime::step(const int32_t* inputs, const int32_t* targets) {
  RankStepStats stats;
  intervals_.clear();
  memory_.clear();
  step_start_ = clock_seconds();
  backend_->arena().reset_peak();
  if (host_arena_) host_arena_->reset_peak();
  comm_.take_busy_seconds();
  if (sharded_) {
    sharded_->step_begin();
  } else {
    backend_->zero_gradients();
  }
  if (balance_pool_) balance_pool_->step_begin();
  layer_cpu_seconds_ = {0, 0, 0};
  if (offload_) offload_->step_begin();
  for (size_t i = 0; i < schedule_.ops.size(); ++i) {
    run_op(i, schedule_.ops[i], inputs, targets, stats);
    reap_finished_passes(false, stats);
    if (sharded_) sharded_->reap(false);
    record_completed(false);
  }
  if (!pending_gathers_.empty()) {  // ZeRO 1-2: the other replicas' updated shards arrived
    for (const CommHandle& h : pending_gathers_) wait(h, stats);
    pending_gathers_.clear();
    backend_->parameters_changed();  // a GPU's bf16 copy follows them
  }
  reap_finished_passes(true, stats);
  record_completed(true);
  if (host_link_) record_offload_copies();
  if (!passes_.empty()) throw Error(fmt::format("rank {}: {} micro-batch passes left at the end of the step", comm_.rank(), passes_.size()));
  backend_->fence();
  stats.step_seconds = now();
  stats.communication_seconds = comm_.take_busy_seconds();
  stats.peak_arena_bytes = backend_->arena().peak_bytes();
  stats.peak_term_bytes = memory_terms_measured(backend_->arena().peak_breakdown());
  stats.peak_host_arena_bytes = host_arena_ ? host_arena_->peak_bytes() : 0;
  stats.layer_cpu_seconds = layer_cpu_seconds_;
  return stats;
}

double RankRuntime::loss_sum(const int32_t* inputs, const int32_t* targets) {
  const PlanStage& st = plan_.stages[schedule_.stage];
  if (plan_.stages.size() != 1 || st.tp != 1)
    throw Error("a forward-only pass needs the whole model on each rank", {"", "--val-data"},
                "validate with a one-stage plan without tensor parallelism");
  const int T = static_cast<int>(plan_.seq_len);
  const int B = static_cast<int>(st.replica_sequences(plan_.micro_batch_sequences, schedule_.dp_rank));
  const LayerRange& blocks = st.chunks.front();
  backend_->take_loss_sums();
  for (int m = 0; m < plan_.num_micro_batches; ++m) {
    const int64_t first = replica_begin(m) * T;
    std::unique_ptr<StagePass> pass = backend_->pass_begin(blocks.begin, blocks.end, true, true, inputs + first, targets + first, B, T);
    backend_->pass_forward(*pass);
    backend_->pass_release(*pass);
  }
  return backend_->take_loss_sums().cross_entropy;  // the load-balancing loss trains, it does not validate
}

}  // namespace alloy
