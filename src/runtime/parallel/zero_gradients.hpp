// Sharded gradients (ZeRO 2-3 with PlanStage::gradients_sharded()): a data-parallel member keeps
// only its pieces of the stage's gradients. Each bucket's backward piece writes into a temporary
// buffer of the bucket's range, which is reduce-scattered right after it; the member's reduced
// piece is copied back into the shard and the buffer freed. The stage's full gradient buffer
// does not exist.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/parallel/communicator.hpp"
#include "runtime/parallel/param_layout.hpp"
#include "runtime/stage_backend.hpp"

namespace alloy {

class ShardedGradients {
 public:
  // Releases the model's gradient buffer and unbinds its gradient slots; the shard (packed like
  // layout.optimizer_ranges) takes their place. A tied table summed between the first and last
  // stage (layout.tied_embedding) sits whole in the shard, its slot bound there for good.
  ShardedGradients(StageBackend& backend, const ParamLayout& layout, Communicator& comm, const CommGroup& dp);
  ~ShardedGradients();
  ShardedGradients(const ShardedGradients&) = delete;
  ShardedGradients& operator=(const ShardedGradients&) = delete;

  // This member's reduced gradients: (layout.optimizer_floats()), packed like the optimizer ranges.
  float* shard() { return shard_; }
  // Flat gradients [offset, offset + count) of this member's pieces, inside one optimizer range.
  float* shard_at(int64_t offset, int64_t count);
  // Zeroes the shard; no bucket may be in use.
  void step_begin();
  // Before a backward piece of bucket (chunk, bucket): finishes its previous reduce-scatter and
  // the others still in flight but the latest (none left in flight when the backend's collectives
  // share its compute cores: there it would hide nothing and hold a second bucket), then allocates its buffer (zero but for this
  // member's piece, seeded from the shard) and points the views' gradient slots into it. A head tied to the embedding on this stage also binds
  // the embedding's bucket (the head writes the table's gradient).
  void bind(int chunk, int bucket);
  // Posts the reduce-scatter of the bound bucket (chunk, bucket) over the data-parallel group.
  CommHandle reduce_scatter(int chunk, int bucket);
  // Copies back and frees the buckets whose reduce-scatter completed (all of them, waiting, when
  // `wait_all`: before the optimizer reads the shard).
  void reap(bool wait_all);
  double take_wait_seconds();

 private:
  struct Bucket {
    const GradientBucket* layout = nullptr;
    std::vector<size_t> views;  // indices into model.views whose gradients lie in the range
    float* buffer = nullptr;    // (layout->range.count) while bound or reducing
    CommHandle reducing;
    bool in_flight = false;
    int64_t posted = 0;         // order of its latest reduce-scatter among this member's
  };
  Bucket& bucket_at(int chunk, int bucket);
  void bucket_bind(Bucket& b);
  void bucket_finish(Bucket& b);
  void buckets_finish_older();
  void slots_point(const Bucket& b, float* base);

  StageBackend& backend_;
  Model& model_;
  const ParamLayout& layout_;
  Communicator& comm_;
  CommGroup dp_;
  std::vector<float**> slots_;
  std::vector<Bucket> buckets_;  // as layout.buckets
  int head_bucket_ = -1;         // index into buckets_ of the head's, when it writes the table of
  int embedding_bucket_ = -1;    // the embedding's bucket on the same stage (tied); else -1
  int64_t posts_ = 0;            // reduce-scatters posted so far
  int64_t most_in_flight_ = 1;   // reduce-scatters left in flight while the next bucket fills
  float* shard_ = nullptr;
  double wait_seconds_ = 0;
};

}  // namespace alloy
