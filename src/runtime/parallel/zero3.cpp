// Gather-on-use parameters for ZeRO 3, one block (or embedding, or head) at a time.
#include "runtime/parallel/zero3.hpp"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "runtime/device_speed.hpp"
#include "spec/error.hpp"

namespace alloy {

Zero3Parameters::Zero3Parameters(Model& model, const ParamLayout& layout, Communicator& comm, const CommGroup& dp,
                                 const CommGroup& expert_dp)
    : model_(model), layout_(layout), comm_(comm), dp_(dp), expert_dp_(expert_dp), slots_(model_weight_slots(model)) {
  for (const ParameterSegment& s : model.segments)
    if (s.host_block >= 0) offloaded_.insert(s.host_block);
  for (size_t k = 0; k < model.views.size(); ++k) {
    const TensorView& view = model.views[k];
    if (model_offset_on_host(model, view.offset)) continue;
    unit_add_view(units_[param_view_unit(model, view)], k);
  }
  for (const FlatRange& r : layout.optimizer_ranges) {
    if (r.count == 0 || model_offset_on_host(model, r.offset)) continue;
    piece_ranges_.push_back(r);
    piece_floats_ += r.count;
  }
  pieces_ = model.arena->allocate_floats(piece_floats_, "zero3 parameter pieces");
  int64_t at = 0;
  for (const FlatRange& r : piece_ranges_) {
    std::memcpy(pieces_ + at, model_parameters_at(model, r.offset, r.count), static_cast<size_t>(r.count) * sizeof(float));
    at += r.count;
  }
  for (ParameterSegment& s : model.segments) {
    if (s.host_block >= 0) continue;
    model.arena->release(s.params);
    s.params = nullptr;
  }
  model.params = nullptr;
  for (const auto& [id, unit] : units_)
    for (size_t k : unit.views)
      if (slots_[k] != nullptr) *slots_[k] = nullptr;
  model.weights.lm_head = nullptr;
  model.parameter_source = this;
}

// Views come in flat order: one that continues the unit's last span, and is of its kind, extends
// it; else (a block's routed experts, in their own buckets after every other tensor) it opens the
// next span.
void Zero3Parameters::unit_add_view(Unit& unit, size_t k) {
  const TensorView& view = model_.views[k];
  const bool experts = model_.shard.experts_split() && shard_is_routed_expert(view.name);
  if (unit.spans.empty() || unit.spans.back().range.offset + unit.spans.back().range.count != view.offset ||
      unit.spans.back().experts != experts) {
    Span span;
    span.experts = experts;
    span.range = {view.offset, 0};
    span.at = unit.floats;
    unit.spans.push_back(span);
  }
  unit.spans.back().range.count += view.numel;
  unit.floats += view.numel;
  unit.views.push_back(k);
}

float* Zero3Parameters::unit_at(const Unit& unit, int64_t offset) const {
  for (const Span& span : unit.spans)
    if (offset >= span.range.offset && offset < span.range.offset + span.range.count)
      return unit.buffer + span.at + (offset - span.range.offset);
  throw Error(fmt::format("ZeRO 3: parameter offset {} is in none of its unit's spans", offset));
}

float* Zero3Parameters::pieces_at(int64_t offset, int64_t count) {
  // The range may run on through pieces that follow each other in the flat index (the optimizer's
  // spans join them), as they do in pieces().
  int64_t packed = 0;
  for (size_t k = 0; k < piece_ranges_.size(); ++k) {
    const FlatRange& r = piece_ranges_[k];
    if (offset >= r.offset && offset < r.offset + r.count) {
      int64_t end = r.offset + r.count;
      for (size_t n = k + 1; n < piece_ranges_.size() && piece_ranges_[n].offset == end; ++n) end += piece_ranges_[n].count;
      if (offset + count <= end) return pieces_ + packed + (offset - r.offset);
      break;
    }
    packed += r.count;
  }
  throw Error(fmt::format("ZeRO 3: parameters [{}, {}) are in none of this member's device pieces", offset, offset + count));
}

Zero3Parameters::~Zero3Parameters() {
  for (auto& [id, unit] : units_) {
    gather_finish(unit);
    model_.arena->release(unit.buffer);
  }
  model_.arena->release(pieces_);
  model_.parameter_source = nullptr;
}

double Zero3Parameters::take_wait_seconds() { return std::exchange(wait_seconds_, 0.0); }

// Allocates unit.buffer and starts filling each span (left in flight).
void Zero3Parameters::gather_start(Unit& unit) {
  unit.buffer = model_.arena->allocate_floats(unit.floats, "zero3 gathered weights");
  for (Span& span : unit.spans) span_gather_start(unit, span);
  unit.in_flight = true;
}

// The tied table (not sharded) from this member's copy, the rest all-gathered from the members'
// pieces of the one bucket that holds the span, over the bucket's group.
void Zero3Parameters::span_gather_start(Unit& unit, Span& span) {
  float* base = unit.buffer + span.at;
  FlatRange sharded = span.range;
  const FlatRange& tied = layout_.tied_embedding;
  if (tied.count > 0 && tied.offset >= span.range.offset && tied.offset < span.range.offset + span.range.count) {
    std::memcpy(base + (tied.offset - span.range.offset), pieces_at(tied.offset, tied.count),
                static_cast<size_t>(tied.count) * sizeof(float));
    if (tied.offset == sharded.offset) sharded.offset += tied.count;
    sharded.count -= tied.count;
  }
  if (sharded.count == 0) return;
  const GradientBucket* bucket = nullptr;
  for (const GradientBucket& b : layout_.buckets)
    if (sharded.offset >= b.range.offset && sharded.offset + sharded.count <= b.range.offset + b.range.count) bucket = &b;
  if (bucket == nullptr) throw Error(fmt::format("ZeRO 3: parameters at offset {} lie in no gradient bucket", sharded.offset));
  const CommGroup& group = bucket->experts ? expert_dp_ : dp_;
  std::vector<int64_t> counts;
  int64_t piece_begin = bucket->range.offset;
  for (size_t d = 0; d < bucket->piece_counts.size(); ++d) {
    const int64_t begin = std::max(piece_begin, sharded.offset);
    const int64_t end = std::min(piece_begin + bucket->piece_counts[d], sharded.offset + sharded.count);
    counts.push_back(std::max<int64_t>(0, end - begin));
    if (static_cast<int>(d) == group.my_index && end > begin) {
      std::memcpy(base + (begin - span.range.offset), pieces_at(begin, end - begin),
                  static_cast<size_t>(end - begin) * sizeof(float));
    }
    piece_begin += bucket->piece_counts[d];
  }
  span.gathering = comm_.all_gather(base + (sharded.offset - span.range.offset), counts, group);
}

void Zero3Parameters::gather_finish(Unit& unit) {
  if (!unit.in_flight) return;
  wait_seconds_ += compute_wait([&] {
    for (Span& span : unit.spans)
      if (span.gathering.valid()) span.gathering.wait();
  });
  for (Span& span : unit.spans) span.gathering = CommHandle();
  unit.in_flight = false;
}

Zero3Parameters::Unit* Zero3Parameters::next_unit(int id, bool backward) {
  const auto found = [&](int other) {
    auto it = units_.find(other);
    return it == units_.end() ? nullptr : &it->second;
  };
  // Blocks are the non-negative ids, in model order.
  const int first_block = units_.lower_bound(0) == units_.end() ? -1 : units_.lower_bound(0)->first;
  const int last_block = units_.empty() || units_.rbegin()->first < 0 ? -1 : units_.rbegin()->first;
  if (!backward) {
    if (id == kUnitEmbedding) return first_block >= 0 ? found(first_block) : found(kUnitHead);
    if (id == kUnitHead) return nullptr;
    if (Unit* next = found(id + 1)) return next;
    return id == last_block ? found(kUnitHead) : nullptr;
  }
  if (id == kUnitHead) return last_block >= 0 ? found(last_block) : found(kUnitEmbedding);
  if (id == kUnitEmbedding) return nullptr;
  if (Unit* previous = found(id - 1)) return previous;
  return id == first_block ? found(kUnitEmbedding) : nullptr;
}

void Zero3Parameters::drop_prefetched() {
  for (auto& [id, unit] : units_) {
    if (unit.holders > 0 || unit.buffer == nullptr) continue;
    gather_finish(unit);
    model_.arena->release(unit.buffer);
    unit.buffer = nullptr;
  }
}

void Zero3Parameters::bind(const Unit& unit, bool bound) {
  for (size_t k : unit.views) {
    if (slots_[k] != nullptr) *slots_[k] = bound ? unit_at(unit, model_.views[k].offset) : nullptr;
  }
  if (model_.spec.tied_embeddings) model_.weights.lm_head = model_.weights.token;
}

void Zero3Parameters::acquire(int id, bool backward) {
  if (offloaded_.count(id) > 0) return;  // the offload engine's
  // A tied head reads the embedding's table when both are on this stage; the embedding's own
  // successor (the first block) is not what the head needs next. Prefetching it held a block's
  // weights through the whole backward (measured: small-gpt on one stage peaked 2.7 MiB above
  // the cost model's two units).
  if (id == kUnitHead && model_.spec.tied_embeddings && model_.shard.has_embedding)
    acquire_unit(kUnitEmbedding, false, false);
  acquire_unit(id, backward, true);
}

void Zero3Parameters::acquire_unit(int id, bool backward, bool prefetch) {
  auto it = units_.find(id);
  if (it == units_.end()) throw Error(fmt::format("ZeRO 3: unit {} has no parameters on this rank", id));
  Unit& unit = it->second;
  if (unit.holders++ > 0) return;
  if (unit.buffer == nullptr) gather_start(unit);
  // Every member acquires in the same order, so the prefetches post their collectives alike.
  Unit* next = prefetch ? next_unit(id, backward) : nullptr;
  if (next != nullptr && next->buffer == nullptr) gather_start(*next);
  gather_finish(unit);
  bind(unit, true);
}

void Zero3Parameters::release(int id, bool /*backward*/) {
  if (offloaded_.count(id) > 0) return;
  Unit& unit = units_.at(id);
  if (--unit.holders == 0) {
    bind(unit, false);
    model_.arena->release(unit.buffer);
    unit.buffer = nullptr;
  }
  if (id == kUnitHead && model_.spec.tied_embeddings && model_.shard.has_embedding) release(kUnitEmbedding, false);
}

std::vector<float> Zero3Parameters::full_parameters() {
  std::vector<float> full(static_cast<size_t>(model_.num_parameters));
  for (auto& [id, unit] : units_) {
    acquire(id, false);
    for (const Span& span : unit.spans)
      std::memcpy(full.data() + span.range.offset, unit.buffer + span.at, static_cast<size_t>(span.range.count) * sizeof(float));
    release(id, false);
  }
  drop_prefetched();
  for (const ParameterSegment& s : model_.segments)
    if (s.host_block >= 0)
      std::memcpy(full.data() + s.offset, s.params, static_cast<size_t>(s.count) * sizeof(float));
  return full;
}

}  // namespace alloy
