// Sharded gradients: per-bucket buffers reduce-scattered after every micro-batch into the shard.
#include "runtime/parallel/zero_gradients.hpp"

#include <utility>

#include <fmt/format.h>

#include "runtime/device_speed.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace {

bool range_holds(const FlatRange& range, int64_t offset) {
  return offset >= range.offset && offset < range.offset + range.count;
}

}  // namespace

ShardedGradients::ShardedGradients(StageBackend& backend, const ParamLayout& layout, Communicator& comm,
                                   const CommGroup& dp)
    : backend_(backend), model_(backend.model()), layout_(layout), comm_(comm), dp_(dp),
      slots_(model_gradient_slots(backend.model())), most_in_flight_(backend.collectives_share_compute() ? 0 : 1) {
  if (model_.segments.size() != 1 || model_.segments.front().host_block >= 0)
    throw Error("sharded gradients need every parameter in the device arena", {"", "shard_gradients"},
                "do not combine shard_gradients with weight offload");
  const bool tied_here = model_.spec.tied_embeddings && model_.shard.has_embedding && model_.shard.has_head &&
                         layout.tied_embedding.count == 0;
  for (const GradientBucket& g : layout.buckets) {
    Bucket b;
    b.layout = &g;
    for (size_t k = 0; k < model_.views.size(); ++k) {
      const TensorView& view = model_.views[k];
      if (!range_holds(g.range, view.offset)) continue;
      b.views.push_back(k);
      const int unit = param_view_unit(model_, view);
      const int index = static_cast<int>(buckets_.size());
      if (tied_here && unit == kUnitHead) head_bucket_ = index;
      if (tied_here && view.name == "embed.token") embedding_bucket_ = index;
    }
    buckets_.push_back(std::move(b));
  }
  if (head_bucket_ == embedding_bucket_) head_bucket_ = embedding_bucket_ = -1;  // one bucket binds both

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
}

ShardedGradients::~ShardedGradients() {
  for (Bucket& b : buckets_) {
    if (b.in_flight) b.reducing.wait();
    backend_.arena().release(b.buffer);
  }
  backend_.arena().release(shard_);
}

float* ShardedGradients::shard_at(int64_t offset, int64_t count) {
  const int64_t packed = layout_.packed_offset(offset);
  if (count > 0 && layout_.packed_offset(offset + count - 1) != packed + count - 1)
    throw Error(fmt::format("gradients [{}, {}) are not one of this member's pieces", offset, offset + count));
  return shard_ + packed;
}

void ShardedGradients::step_begin() {
  for (const Bucket& b : buckets_)
    if (b.buffer != nullptr)
      throw Error(fmt::format("rank {}: a gradient bucket of chunk {} is still in use at the start of a step",
                              comm_.rank(), b.layout->chunk));
  backend_.fill_zero(shard_, layout_.optimizer_floats());
}

ShardedGradients::Bucket& ShardedGradients::bucket_at(int chunk, int bucket) {
  for (Bucket& b : buckets_)
    if (b.layout->chunk == chunk && b.layout->bucket == bucket) return b;
  throw Error(fmt::format("no gradient bucket {} in chunk {} of this rank's schedule", bucket, chunk));
}

void ShardedGradients::bind(int chunk, int bucket) {
  Bucket& b = bucket_at(chunk, bucket);
  bucket_bind(b);
  if (head_bucket_ >= 0 && &b == &buckets_[static_cast<size_t>(head_bucket_)])
    bucket_bind(buckets_[static_cast<size_t>(embedding_bucket_)]);
}

// Zero but for this member's piece, which starts from the shard: the reduce-scatter then leaves
// there the previous micro-batches' sum plus every member's new gradients.
void ShardedGradients::bucket_bind(Bucket& b) {
  if (b.in_flight) bucket_finish(b);
  if (b.buffer != nullptr) return;  // bound already (the embedding's, by a tied head)
  buckets_finish_older();
  const FlatRange& range = b.layout->range;
  const FlatRange& owned = b.layout->owned;
  b.buffer = backend_.arena().allocate_floats(range.count, "gradient bucket");
  const int64_t before = owned.offset - range.offset;
  const int64_t after = range.count - before - owned.count;
  backend_.fill_zero(b.buffer, before);
  if (owned.count > 0)
    backend_.copy(b.buffer + before, shard_at(owned.offset, owned.count), owned.count * static_cast<int64_t>(sizeof(float)));
  backend_.fill_zero(b.buffer + before + owned.count, after);
  slots_point(b, b.buffer);
}

CommHandle ShardedGradients::reduce_scatter(int chunk, int bucket) {
  Bucket& b = bucket_at(chunk, bucket);
  if (b.buffer == nullptr || b.in_flight)
    throw Error(fmt::format("rank {}: reduce-scatter of gradient bucket {} of chunk {} before its backward",
                            comm_.rank(), bucket, chunk));
  b.reducing = comm_.reduce_scatter(b.buffer, b.layout->piece_counts, dp_);
  b.in_flight = true;
  b.posted = ++posts_;
  return b.reducing;
}

void ShardedGradients::reap(bool wait_all) {
  for (Bucket& b : buckets_) {
    if (b.in_flight && (wait_all || b.reducing.done())) bucket_finish(b);
    if (wait_all && b.buffer != nullptr)
      throw Error(fmt::format("rank {}: gradient bucket {} of chunk {} was filled but never reduce-scattered",
                              comm_.rank(), b.layout->bucket, b.layout->chunk));
  }
}

// A member ahead of the others would otherwise pile up buckets waiting for them: at most the
// latest reduce-scatter stays in flight while the next bucket fills, and none on a backend whose
// collectives reduce on its compute cores.
void ShardedGradients::buckets_finish_older() {
  for (Bucket& other : buckets_)
    if (other.in_flight && other.posted <= posts_ - most_in_flight_) bucket_finish(other);
}

void ShardedGradients::bucket_finish(Bucket& b) {
  wait_seconds_ += compute_wait([&] { b.reducing.wait(); });
  b.in_flight = false;
  const FlatRange& owned = b.layout->owned;
  if (owned.count > 0)
    backend_.copy(shard_at(owned.offset, owned.count), b.buffer + (owned.offset - b.layout->range.offset),
                  owned.count * static_cast<int64_t>(sizeof(float)));
  slots_point(b, nullptr);
  backend_.arena().release(b.buffer);
  b.buffer = nullptr;
}

void ShardedGradients::slots_point(const Bucket& b, float* base) {
  for (size_t k : b.views) {
    if (slots_[k] != nullptr) *slots_[k] = base == nullptr ? nullptr : base + (model_.views[k].offset - b.layout->range.offset);
  }
  if (model_.spec.tied_embeddings) model_.gradients.lm_head = model_.gradients.token;
}

double ShardedGradients::take_wait_seconds() { return std::exchange(wait_seconds_, 0.0); }

}  // namespace alloy
