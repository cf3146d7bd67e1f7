// The ZeRO-3 weight gathers of a stage that no compute hides: the first block of every pass, or
// of a forward that opens on offloaded blocks, the first resident one after them; and whether a
// stage keeps its weights gathered for a whole step.
#include <algorithm>
#include <vector>

#include "cost/cost_model.hpp"
#include "cost/runtime_traits.hpp"

namespace alloy {

bool CostModel::stage_keeps_weights_gathered(const StageShape& shape, const StageChoice& c) const {
  const bool pipelined = c.chunks_sent > 0 || c.chunks_received > 0;
  return pipelined && c.zero >= 3 &&
         runtime_traits(cluster_.device_types[shape.device_type]).zero3_pipelined_keeps_weights_gathered;
}

Zero3FirstGathers CostModel::stage_zero3_first_gathers(const StageShape& shape, const StageUnitCosts& u,
                                                       const StageChoice& c) const {
  Zero3FirstGathers out;
  if (c.zero != 3 || shape.dp <= 1 || c.blocks <= 0) return out;
  const double e = precision_bytes(train_.precision);
  // Block `local` (its index among the stage's blocks, chunks in order) with `extra` parameters
  // beside it: the dense part over dp; under expert parallelism an MoE block's routed experts
  // over the members holding the same ones.
  const auto gather_seconds = [&](int local, double extra) {
    const bool dense = local < c.dense_blocks;
    const double experts = !dense && shape.ep > 1 ? u.block_expert_parameters : 0;
    const double parameters = (dense ? u.dense_block.parameters : u.block_parameters) + extra;
    double seconds =
        group_seconds(shape.device_type, CollectiveOp::CollectiveOp_all_gather, (parameters - experts) * e, shape.dp_group);
    if (experts > 0)
      seconds += group_seconds(shape.device_type, CollectiveOp::CollectiveOp_all_gather, experts * e, shape.expert_dp_group);
    return seconds;
  };
  const double embedding = c.has_embedding ? u.embedding_parameters : 0;
  const double head = stage_head_parameters(shape, u, c);
  const int last = c.blocks - 1;
  // What a unit beside its block adds to the block's gather: the embedding rides with the stage's
  // first block, the head with its last (as the schedule counts a block's parameters).
  const auto beside = [&](int local) { return (local == 0 ? embedding : 0) + (local == last ? head : 0); };
  const std::vector<int> sizes = stage_chunk_blocks(c.blocks, std::max(1, c.virtual_chunks));
  int begin = 0;  // the chunk's first block, as a local index
  for (const int size : sizes) {
    if (size <= 0) continue;
    // The forward starts at the chunk's first block, the backward at its last; the first
    // `offloaded` blocks of the stage live in host memory.
    const int forward_first = begin;
    const int backward_first = begin + size - 1;
    begin += size;
    // Offloaded blocks prefetch nothing: a forward that opens on them gathers its first resident
    // block (the stage's `offloaded`-th) alone once it gets there, unless the embedding opens the
    // pass and prefetches it. The backward reaches the offloaded blocks last.
    const bool embedding_opens = forward_first == 0 && embedding > 0;
    const int forward_alone = forward_first >= c.offloaded || embedding_opens ? forward_first : c.offloaded;
    if (forward_alone >= c.offloaded && forward_alone <= backward_first) {
      out.forward_seconds += gather_seconds(forward_alone, beside(forward_alone));
      ++out.forward_blocks;
    }
    if (backward_first >= c.offloaded) {
      out.backward_seconds += gather_seconds(backward_first, beside(backward_first));
      ++out.backward_blocks;
    }
    // The head after the last block's forward, the embedding after the first block's backward:
    // gathered a block ahead when that block is not the pass's first.
    const auto ahead = [&](double parameters, double hiding_seconds) {
      const double seconds = group_seconds(shape.device_type, CollectiveOp::CollectiveOp_all_gather, parameters * e, shape.dp_group);
      return std::max(0.0, seconds - hiding_seconds);
    };
    if (head > 0 && backward_first == last && forward_first != last && last >= c.offloaded)
      out.ahead_forward_seconds += ahead(head, u.zero3_hiding.forward_seconds);
    if (embedding > 0 && forward_first == 0 && backward_first != 0 && c.offloaded == 0)
      out.ahead_backward_seconds += ahead(embedding, u.zero3_hiding.backward_seconds);
  }
  return out;
}

}  // namespace alloy
