// Sharded gradients (ZeRO 2-3 with PlanStage::gradients_sharded()): a data-parallel member keeps
// only its pieces of the stage's gradients. The backward writes each part of a bucket into a
// temporary buffer of the part's range, reduce-scattered as soon as the part is complete; the
// member's reduced share is copied back into the shard and the buffer freed. The stage's full
// gradient buffer does not exist.
//
// Parts: where the backend reports its gradient writes (StageBackend::reports_gradient_writes),
// a bucket is cut into parts of at most the plan's bucket size: consecutive whole tensors, or rows
// of a larger matrix, so that what is live is the shard and one or two parts, however large a
// block. Elsewhere a part is a whole bucket, bound before its backward piece. A part's reduction
// gives every member the part's intersection with its ZeRO piece of the bucket, so the shard is
// laid out as without parts.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "runtime/parallel/communicator.hpp"
#include "runtime/parallel/param_layout.hpp"
#include "runtime/stage_backend.hpp"

namespace alloy {

class ShardedGradients final : public GradientSink {
 public:
  // Releases the model's gradient buffer and unbinds its gradient slots; the shard (packed like
  // layout.optimizer_ranges) takes their place. A tied table summed between the first and last
  // stage (layout.tied_embedding) sits whole in the shard, its slot bound there for good.
  // part_bytes: the largest part (fp32 gradients), when the backend reports its writes.
  // bf16_wire: parts cross the network in bf16 and each member adds the sum it receives to its
  // shard in fp32 (a backend whose memory is the host's).
  // dp reduces the buckets' parts, expert_dp the routed experts' (GradientBucket::experts).
  ShardedGradients(StageBackend& backend, const ParamLayout& layout, Communicator& comm, const CommGroup& dp,
                   const CommGroup& expert_dp, double part_bytes, bool bf16_wire);
  ~ShardedGradients() override;
  ShardedGradients(const ShardedGradients&) = delete;
  ShardedGradients& operator=(const ShardedGradients&) = delete;

  // This member's reduced gradients: (layout.optimizer_floats()), packed like the optimizer ranges.
  float* shard() { return shard_; }
  // Flat gradients [offset, offset + count) of this member's pieces, inside one optimizer range.
  float* shard_at(int64_t offset, int64_t count);
  // Zeroes the shard; no part may be in use.
  void step_begin();
  // Before a backward piece of bucket (chunk, bucket): without reported writes, binds the whole
  // bucket (and with a head tied to the embedding on this stage, the embedding's bucket too: the
  // head writes the table's gradient). With them, parts are bound as the backward reaches them.
  void bind(int chunk, int bucket);
  // After the backward piece: posts the reduce-scatter of every part of the bucket not yet posted
  // (binding any the backward never wrote); returns the latest one's handle.
  CommHandle reduce_scatter(int chunk, int bucket);
  // Copies back and frees the parts whose reduce-scatter completed (all of them, waiting, when
  // `wait_all`: before the optimizer reads the shard).
  void reap(bool wait_all);
  double take_wait_seconds();

  // GradientSink: the backward's writes bind parts, and a part complete is reduce-scattered.
  std::vector<int64_t> row_cuts(float* const* slot, int64_t rows) override;
  float* writing(float* const* slot, int64_t begin, int64_t end) override;
  void written(float* const* slot, int64_t begin, int64_t end) override;

 private:
  struct Part {
    bool experts = false;         // reduced over expert-dp (else dp)
    FlatRange range;              // inside its bucket's range
    std::vector<int64_t> counts;  // each member's share: the range's overlap with its ZeRO piece
    FlatRange owned;              // this member's share
    float* buffer = nullptr;      // (range.count) while bound or reducing
    CommHandle reducing;
    bool in_flight = false;
    int64_t posted = 0;           // order of its latest reduce-scatter among this member's
    int64_t written = 0;          // floats written since bound
    bool posted_this_round = false;  // since its bucket's reduce-scatter op last ran
  };
  struct Bucket {
    const GradientBucket* layout = nullptr;
    std::vector<size_t> parts;  // indices into parts_, in flat order
  };
  // A gradient slot of a tensor inside the buckets: its view and the parts it lies in.
  struct Managed {
    size_t view = 0;
    int64_t row_floats = 1;
    std::vector<size_t> parts;   // in flat order
    bool counts = true;          // false for a tied head's writes into the table (the embedding's count)
  };
  void parts_build(double part_bytes);
  void managed_build(bool tied_here);
  // The buckets of (chunk, bucket): its own and, under expert parallelism, its routed experts'.
  std::vector<Bucket*> buckets_at(int chunk, int bucket);
  size_t part_of_row(const Managed& m, int64_t row) const;
  void part_bind(size_t index);
  void part_post(Part& p);
  void part_finish(Part& p);
  void parts_finish_older();
  // Points the slots of the views lying wholly in the part into its buffer (nullptr: unbinds).
  void slots_point(const Part& p, float* base);

  StageBackend& backend_;
  Model& model_;
  const ParamLayout& layout_;
  Communicator& comm_;
  CommGroup dp_;
  CommGroup expert_dp_;
  std::vector<float**> slots_;
  std::vector<Part> parts_;
  std::vector<Bucket> buckets_;  // as layout.buckets
  std::unordered_map<float* const*, Managed> managed_;  // by slot, when the backend reports writes
  bool reported_ = false;        // the backend reports its writes: parts bound on them
  bool bf16_wire_ = false;       // reduce-scatters in bf16, summed into the shard here
  int head_bucket_ = -1;         // without reported writes: the head's bucket, when it writes the table of
  int embedding_bucket_ = -1;    // the embedding's bucket on the same stage (tied); else -1
  int64_t posts_ = 0;            // reduce-scatters posted so far
  int64_t most_in_flight_ = 1;   // reduce-scatters left in flight while the next part fills
  float* shard_ = nullptr;
  double wait_seconds_ = 0;
};

}  // namespace alloy
