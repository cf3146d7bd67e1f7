// Sharded gradients: part buffers reduce-scattered after every micro-batch into the shard.
#include "runtime/parallel/zero_gradients.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "runtime/device_speed.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace {

bool range_holds(const FlatRange& range, int64_t offset) {
  return offset >= range.offset && offset < range.offset + range.count;
}

// The part of `a` inside `b` (empty: at a's start).
FlatRange overlap(const FlatRange& a, const FlatRange& b) {
  const int64_t begin = std::max(a.offset, b.offset);
  const int64_t end = std::min(a.offset + a.count, b.offset + b.count);
  return end > begin ? FlatRange{begin, end - begin} : FlatRange{a.offset, 0};
}

}  // namespace

ShardedGradients::ShardedGradients(StageBackend& backend, const ParamLayout& layout, Communicator& comm,
                                   const CommGroup& dp, const CommGroup& expert_dp, double part_bytes, bool bf16_wire)
    : backend_(backend), model_(backend.model()), layout_(layout), comm_(comm), dp_(dp), expert_dp_(expert_dp),
      slots_(model_gradient_slots(backend.model())), reported_(backend.reports_gradient_writes()), bf16_wire_(bf16_wire),
      most_in_flight_(backend.collectives_share_compute() ? 0 : 1) {
  if (model_.segments.size() != 1 || model_.segments.front().host_block >= 0)
    throw Error("sharded gradients need every parameter in the device arena", {"", "shard_gradients"},
                "do not combine shard_gradients with weight offload");
  if (bf16_wire_ && !backend.memory_is_host())
    throw Error(fmt::format("the {} backend does not send sharded gradients in bf16", backend.name()),
                {"", "gradient_communication"}, "set gradient_communication: fp32 in the training file");
  const bool tied_here = model_.spec.tied_embeddings && model_.shard.has_embedding && model_.shard.has_head &&
                         layout.tied_embedding.count == 0;
  parts_build(part_bytes);
  if (reported_) {
    managed_build(tied_here);
  } else if (tied_here) {
    for (size_t b = 0; b < buckets_.size(); ++b)
      for (const TensorView& view : model_.views) {
        if (!range_holds(buckets_[b].layout->range, view.offset)) continue;
        if (param_view_unit(model_, view) == kUnitHead) head_bucket_ = static_cast<int>(b);
        if (view.name == "embed.token") embedding_bucket_ = static_cast<int>(b);
      }
    if (head_bucket_ == embedding_bucket_) head_bucket_ = embedding_bucket_ = -1;  // one bucket binds both
  }

  shard_ = backend_.arena().allocate_floats(layout.optimizer_floats(), "sharded gradients");
  backend_.fill_zero(shard_, layout.optimizer_floats());
  backend_.arena().release(model_.segments.front().grads);
  model_.segments.front().grads = nullptr;
  model_.grads = nullptr;
  for (float** slot : slots_)
    if (slot != nullptr) *slot = nullptr;
  model_.gradients.lm_head = nullptr;
  const FlatRange& tied = layout.tied_embedding;
  if (tied.count > 0) {
    model_.gradients.token = shard_at(tied.offset, tied.count);
    model_.gradients.lm_head = model_.gradients.token;
  }
  if (reported_) model_.gradient_sink = this;
}

ShardedGradients::~ShardedGradients() {
  if (model_.gradient_sink == this) model_.gradient_sink = nullptr;
  for (Part& p : parts_) {
    if (p.in_flight) p.reducing.wait();
    backend_.arena().release(p.buffer);
  }
  backend_.arena().release(shard_);
}

// Whole buckets, or (reported writes) runs of whole tensors up to the part size and rows of any
// larger matrix.
void ShardedGradients::parts_build(double part_bytes) {
  const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(part_bytes / sizeof(float)));
  for (const GradientBucket& g : layout_.buckets) {
    Bucket bucket;
    bucket.layout = &g;
    const auto add = [&](const FlatRange& range) {
      Part p;
      p.experts = g.experts;
      p.range = range;
      int64_t piece_begin = g.range.offset;
      for (int64_t count : g.piece_counts) {
        p.counts.push_back(overlap(range, {piece_begin, count}).count);
        piece_begin += count;
      }
      p.owned = overlap(range, g.owned);
      bucket.parts.push_back(parts_.size());
      parts_.push_back(std::move(p));
    };
    if (!reported_) {
      add(g.range);
      buckets_.push_back(std::move(bucket));
      continue;
    }
    FlatRange run{g.range.offset, 0};
    const auto close = [&] {
      if (run.count > 0) add(run);
      run = {run.offset + run.count, 0};
    };
    for (const TensorView& view : model_.views) {
      if (!range_holds(g.range, view.offset)) continue;
      if (view.shape.size() == 2 && view.numel > cap) {
        close();
        const int64_t row_floats = view.numel / view.shape[0];
        const int64_t rows_per_part = std::max<int64_t>(1, cap / row_floats);
        for (int64_t row = 0; row < view.shape[0]; row += rows_per_part)
          add({view.offset + row * row_floats, std::min(rows_per_part, view.shape[0] - row) * row_floats});
        run = {view.offset + view.numel, 0};
        continue;
      }
      if (run.count > 0 && run.count + view.numel > cap) close();
      run.count += view.numel;
    }
    close();
    buckets_.push_back(std::move(bucket));
  }
}

void ShardedGradients::managed_build(bool tied_here) {
  for (size_t k = 0; k < model_.views.size(); ++k) {
    const TensorView& view = model_.views[k];
    if (slots_[k] == nullptr) continue;
    Managed m;
    m.view = k;
    m.row_floats = view.shape.size() == 2 ? view.numel / view.shape[0] : 1;
    for (size_t p = 0; p < parts_.size(); ++p)
      if (overlap(parts_[p].range, {view.offset, view.numel}).count > 0) m.parts.push_back(p);
    if (m.parts.empty()) continue;  // the tied table kept whole in the shard
    if (tied_here && view.name == "embed.token") {
      Managed head = m;
      head.counts = false;  // the table is complete after the embedding's backward, not the head's
      managed_.emplace(&model_.gradients.lm_head, head);
    }
    managed_.emplace(slots_[k], std::move(m));
  }
}

float* ShardedGradients::shard_at(int64_t offset, int64_t count) {
  const int64_t packed = layout_.packed_offset(offset);
  if (count > 0 && layout_.packed_offset(offset + count - 1) != packed + count - 1)
    throw Error(fmt::format("gradients [{}, {}) are not one of this member's pieces", offset, offset + count));
  return shard_ + packed;
}

void ShardedGradients::step_begin() {
  for (const Part& p : parts_)
    if (p.buffer != nullptr)
      throw Error(fmt::format("rank {}: gradients at offset {} are still in use at the start of a step", comm_.rank(),
                              p.range.offset));
  backend_.fill_zero(shard_, layout_.optimizer_floats());
}

std::vector<ShardedGradients::Bucket*> ShardedGradients::buckets_at(int chunk, int bucket) {
  std::vector<Bucket*> found;
  for (Bucket& b : buckets_)
    if (b.layout->chunk == chunk && b.layout->bucket == bucket) found.push_back(&b);
  if (found.empty()) throw Error(fmt::format("no gradient bucket {} in chunk {} of this rank's schedule", bucket, chunk));
  return found;
}

void ShardedGradients::bind(int chunk, int bucket) {
  if (reported_) return;
  for (Bucket* b : buckets_at(chunk, bucket)) {
    part_bind(b->parts.front());
    if (head_bucket_ >= 0 && b == &buckets_[static_cast<size_t>(head_bucket_)])
      part_bind(buckets_[static_cast<size_t>(embedding_bucket_)].parts.front());
  }
}

CommHandle ShardedGradients::reduce_scatter(int chunk, int bucket) {
  const Part* latest = nullptr;
  for (Bucket* b : buckets_at(chunk, bucket)) {
    if (!reported_ && parts_[b->parts.front()].buffer == nullptr)
      throw Error(fmt::format("rank {}: reduce-scatter of gradient bucket {} of chunk {} before its backward",
                              comm_.rank(), bucket, chunk));
    for (size_t index : b->parts) {
      Part& p = parts_[index];
      if (!p.posted_this_round) {
        part_bind(index);  // a part the backward never wrote still adds its zeros
        part_post(p);
      }
      p.posted_this_round = false;
      if (latest == nullptr || p.posted > latest->posted) latest = &p;
    }
  }
  return latest->reducing;
}

// Zero but for this member's share, which starts from the shard: the reduce-scatter then leaves
// there the previous micro-batches' sum plus every member's new gradients. In bf16 on the wire the
// share starts at zero too (the running sum stays in fp32): part_finish adds it to the shard.
void ShardedGradients::part_bind(size_t index) {
  Part& p = parts_[index];
  if (p.in_flight) part_finish(p);  // written again before its reduction was reaped
  if (p.buffer != nullptr) return;
  parts_finish_older();
  p.buffer = backend_.arena().allocate_floats(p.range.count, "gradient bucket");
  p.written = 0;
  if (bf16_wire_) {
    backend_.fill_zero(p.buffer, p.range.count);
    slots_point(p, p.buffer);
    return;
  }
  const int64_t before = p.owned.offset - p.range.offset;
  const int64_t after = p.range.count - before - p.owned.count;
  backend_.fill_zero(p.buffer, before);
  if (p.owned.count > 0)
    backend_.copy(p.buffer + before, shard_at(p.owned.offset, p.owned.count),
                  p.owned.count * static_cast<int64_t>(sizeof(float)));
  backend_.fill_zero(p.buffer + before + p.owned.count, after);
  slots_point(p, p.buffer);
}

void ShardedGradients::part_post(Part& p) {
  const CommGroup& group = p.experts ? expert_dp_ : dp_;
  p.reducing = bf16_wire_ ? comm_.reduce_scatter_bf16(p.buffer, p.counts, group) : comm_.reduce_scatter(p.buffer, p.counts, group);
  p.in_flight = true;
  p.posted_this_round = true;
  p.posted = ++posts_;
}

void ShardedGradients::reap(bool wait_all) {
  for (Part& p : parts_) {
    if (p.in_flight && (wait_all || p.reducing.done())) part_finish(p);
    if (wait_all && p.buffer != nullptr)
      throw Error(fmt::format("rank {}: gradients at offset {} were written but never reduce-scattered", comm_.rank(),
                              p.range.offset));
  }
}

// A member ahead of the others would otherwise pile up parts waiting for them: at most the
// latest reduce-scatter stays in flight while the next part fills, and none on a backend whose
// collectives reduce on its compute cores.
void ShardedGradients::parts_finish_older() {
  for (Part& other : parts_)
    if (other.in_flight && other.posted <= posts_ - most_in_flight_) part_finish(other);
}

void ShardedGradients::part_finish(Part& p) {
  wait_seconds_ += compute_wait([&] { p.reducing.wait(); });
  p.in_flight = false;
  const float* received = p.buffer + (p.owned.offset - p.range.offset);
  if (bf16_wire_) {  // host memory (checked at construction)
    float* shard = p.owned.count > 0 ? shard_at(p.owned.offset, p.owned.count) : nullptr;
    for (int64_t k = 0; k < p.owned.count; ++k) shard[k] += received[k];
  } else if (p.owned.count > 0) {
    backend_.copy(shard_at(p.owned.offset, p.owned.count), received, p.owned.count * static_cast<int64_t>(sizeof(float)));
  }
  slots_point(p, nullptr);
  backend_.arena().release(p.buffer);
  p.buffer = nullptr;
}

void ShardedGradients::slots_point(const Part& p, float* base) {
  for (size_t k = 0; k < model_.views.size(); ++k) {
    const TensorView& view = model_.views[k];
    if (slots_[k] == nullptr || view.offset < p.range.offset || view.offset + view.numel > p.range.offset + p.range.count)
      continue;
    *slots_[k] = base == nullptr ? nullptr : base + (view.offset - p.range.offset);
  }
  if (model_.spec.tied_embeddings) model_.gradients.lm_head = model_.gradients.token;
}

// m.parts ascend in the flat index: the last part starting at or before the row's first float.
size_t ShardedGradients::part_of_row(const Managed& m, int64_t row) const {
  const int64_t offset = model_.views[m.view].offset + row * m.row_floats;
  const auto after = std::upper_bound(m.parts.begin(), m.parts.end(), offset,
                                      [&](int64_t at, size_t p) { return at < parts_[p].range.offset; });
  if (after != m.parts.begin() && range_holds(parts_[*(after - 1)].range, offset)) return *(after - 1);
  throw Error(fmt::format("row {} of {} lies in no gradient part", row, model_.views[m.view].name));
}

std::vector<int64_t> ShardedGradients::row_cuts(float* const* slot, int64_t rows) {
  const auto found = managed_.find(slot);
  if (found == managed_.end()) return {0, rows};
  const Managed& m = found->second;
  const TensorView& view = model_.views[m.view];
  std::vector<int64_t> cuts{0};
  for (size_t p : m.parts) {
    const FlatRange& range = parts_[p].range;
    const int64_t end = std::min(range.offset + range.count, view.offset + view.numel);
    cuts.push_back((end - view.offset) / m.row_floats);
  }
  if (cuts.back() != rows)
    throw Error(fmt::format("{} has {} rows, written as {}", view.name, cuts.back(), rows));
  return cuts;
}

float* ShardedGradients::writing(float* const* slot, int64_t begin, int64_t end) {
  const auto found = managed_.find(slot);
  if (found == managed_.end()) {
    if (begin != 0) throw Error("a gradient written from a row other than the first needs a part per row range");
    return *slot;
  }
  const Managed& m = found->second;
  const TensorView& view = model_.views[m.view];
  end = std::min(end, view.numel / m.row_floats);
  const size_t index = part_of_row(m, begin);
  if (part_of_row(m, end - 1) != index)
    throw Error(fmt::format("rows [{}, {}) of {}'s gradient span two parts", begin, end, view.name));
  part_bind(index);
  const Part& p = parts_[index];
  return p.buffer + (view.offset + begin * m.row_floats - p.range.offset);
}

void ShardedGradients::written(float* const* slot, int64_t begin, int64_t end) {
  const auto found = managed_.find(slot);
  if (found == managed_.end() || !found->second.counts) return;
  const Managed& m = found->second;
  end = std::min(end, model_.views[m.view].numel / m.row_floats);
  Part& p = parts_[part_of_row(m, begin)];
  p.written += (end - begin) * m.row_floats;
  if (p.written == p.range.count) part_post(p);
}

double ShardedGradients::take_wait_seconds() { return std::exchange(wait_seconds_, 0.0); }

}  // namespace alloy
