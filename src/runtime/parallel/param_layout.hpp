// Where a rank's parameters and gradients sit for data parallelism: the gradient buckets of
// its schedule as ranges of the flat buffers, each member's ZeRO piece of every bucket, the
// tied embedding synchronised between the first and last stage, what this rank's optimizer
// updates and what it counts towards the global gradient norm.
#pragma once

#include <cstdint>
#include <vector>

#include "plan/plan.hpp"
#include "plan/schedule.hpp"
#include "runtime/model.hpp"

namespace alloy {

struct GradientBucket {
  bool experts = false;               // the routed experts of blocks [block_begin, block_end), reduced
                                      // and sharded over the expert-dp group (else: over dp)
  int chunk = 0;
  int bucket = 0;
  int block_begin = 0;
  int block_end = 0;
  FlatRange range;                    // the bucket's gradients (the tied embedding excluded)
  std::vector<int64_t> piece_counts;  // ZeRO pieces of the range, one per member of its group
                                      // (dp: PlanStage::zero_piece, uneven under uneven shares;
                                      // expert-dp: even)
  FlatRange owned;                    // this rank's piece
};

struct ParamLayout {
  // One per (chunk, bucket) and place, in schedule order: a bucket whose parameters lie partly in
  // host memory (offloaded blocks) is reduced a place at a time, each with its own ZeRO pieces.
  // With experts_sharded, each (chunk, bucket) whose blocks hold routed experts has entries for
  // them (experts: true, a place at a time too), right after the others.
  std::vector<GradientBucket> buckets;
  bool sharded = false;                    // ZeRO 1-3 with dp > 1: each member updates its pieces
  FlatRange tied_embedding;                // summed over the embedding group at the optimizer (count 0: none)
  FlatRange experts;                       // routed experts of a shard that splits them (expert
                                           // parallelism), after every other tensor (count 0: none)
  // How `experts` are reduced. false (ZeRO 0): summed over the expert-dp group at the optimizer.
  // true (ZeRO 1-3 with dp > 1): in buckets of their own over the expert-dp group, each member
  // updating its pieces, as the other buckets are over dp.
  bool experts_sharded = false;
  std::vector<FlatRange> optimizer_ranges; // updated by this rank, ascending
  std::vector<FlatRange> norm_ranges;      // counted by this rank in the global norm, ascending
  int64_t optimizer_floats() const;        // total of optimizer_ranges
  // Position of flat parameter `offset` when optimizer_ranges are packed one after another.
  int64_t packed_offset(int64_t offset) const;
};

// The unit a view belongs to: its block index, kUnitEmbedding or kUnitHead (a tied model's
// table on a last stage without the embedding belongs to the head).
int param_view_unit(const Model& model, const TensorView& view);

// `range` cut where the parameters change place: the device's, or one offloaded block's host
// memory (model.segments), in flat order.
std::vector<FlatRange> param_ranges_by_place(const Model& model, const FlatRange& range);

// `model` is the rank's shard; `schedule` its ops (for the buckets); `tied_sync`: the token
// embedding of a tied model lives on two stages and is summed between them instead of inside
// the buckets. Throws alloy::Error if a bucket is not one contiguous range.
ParamLayout param_layout_build(const Plan& plan, const Model& model, const RankSchedule& schedule, bool tied_sync);

}  // namespace alloy
