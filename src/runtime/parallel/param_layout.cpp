// Buckets, ZeRO pieces and optimizer/norm ownership from a rank's shard and schedule.
#include "runtime/parallel/param_layout.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "spec/error.hpp"

namespace alloy {

namespace {

FlatRange bucket_range(const Model& model, const PlanStage& stage, const ScheduleOp& op, bool tied_sync) {
  const bool with_embedding = stage.has_embedding && op.block_begin == stage.chunks.front().begin;
  const bool with_head = stage.has_head && op.block_end == stage.chunks.back().end;
  int64_t begin = -1, end = -1, total = 0;
  for (const TensorView& view : model.views) {
    const int owner = param_view_unit(model, view);
    const bool inside = (owner >= op.block_begin && owner < op.block_end) ||
                        (owner == kUnitEmbedding && with_embedding) || (owner == kUnitHead && with_head);
    if (!inside || (tied_sync && view.name == "embed.token")) continue;
    if (model.shard.experts_split() && shard_is_routed_expert(view.name)) continue;
    begin = begin < 0 ? view.offset : std::min(begin, view.offset);
    end = std::max(end, view.offset + view.numel);
    total += view.numel;
  }
  if (begin < 0 || end - begin != total) {
    throw Error(fmt::format("gradient bucket of blocks [{}, {}) is not one contiguous range of the parameters",
                            op.block_begin, op.block_end));
  }
  return {begin, end - begin};
}

// Parts of [range) that lie inside any of `keep` (ascending, disjoint).
void add_intersections(std::vector<FlatRange>& out, const FlatRange& range, const std::vector<FlatRange>& keep) {
  for (const FlatRange& k : keep) {
    const int64_t begin = std::max(range.offset, k.offset);
    const int64_t end = std::min(range.offset + range.count, k.offset + k.count);
    if (begin < end) out.push_back({begin, end - begin});
  }
}

// The routed experts' views of a shard that splits them: one range after every other tensor.
FlatRange experts_range(const Model& model) {
  if (!model.shard.experts_split()) return {};
  int64_t begin = -1, end = -1;
  for (const TensorView& view : model.views) {
    if (!shard_is_routed_expert(view.name)) continue;
    if (begin < 0) begin = view.offset;
    end = view.offset + view.numel;
  }
  if (begin < 0) return {};
  if (end != model.num_parameters)
    throw Error("the routed experts of an expert-parallel shard must come after its other parameters");
  return {begin, end - begin};
}

// The routed experts of blocks [op.block_begin, op.block_end) of a shard that splits them: one
// range, as the shard lays them out block after block (count 0: none).
FlatRange bucket_experts_range(const Model& model, const ScheduleOp& op) {
  int64_t begin = -1, end = -1;
  for (const TensorView& view : model.views) {
    if (!shard_is_routed_expert(view.name)) continue;
    const int block = param_view_unit(model, view);
    if (block < op.block_begin || block >= op.block_end) continue;
    if (begin >= 0 && view.offset != end)
      throw Error(fmt::format("the routed experts of blocks [{}, {}) are not one contiguous range of the parameters",
                              op.block_begin, op.block_end));
    if (begin < 0) begin = view.offset;
    end = view.offset + view.numel;
  }
  return begin < 0 ? FlatRange{} : FlatRange{begin, end - begin};
}

// The experts' bucket of `op`: even pieces over the expert-dp group (dp / ep members, this rank
// the dp_rank / ep-th).
GradientBucket experts_bucket(const PlanStage& stage, const ScheduleOp& op, const FlatRange& range, int dp_rank) {
  GradientBucket b;
  b.experts = true;
  b.chunk = op.chunk;
  b.bucket = op.bucket;
  b.block_begin = op.block_begin;
  b.block_end = op.block_end;
  b.range = range;
  const int members = stage.dp / stage.ep;
  for (int m = 0; m < members; ++m) {
    const int64_t begin = range.count * m / members, end = range.count * (m + 1) / members;
    b.piece_counts.push_back(end - begin);
    if (m == dp_rank / stage.ep) b.owned = {range.offset + begin, end - begin};
  }
  return b;
}

}  // namespace

std::vector<FlatRange> param_ranges_by_place(const Model& model, const FlatRange& range) {
  std::vector<FlatRange> out;
  for (const ParameterSegment& segment : model.segments) {
    const int64_t begin = std::max(range.offset, segment.offset);
    const int64_t end = std::min(range.offset + range.count, segment.offset + segment.count);
    if (begin < end) out.push_back({begin, end - begin});
  }
  return out;
}

int param_view_unit(const Model& model, const TensorView& view) {
  if (view.name.rfind("layers.", 0) == 0) return std::stoi(view.name.substr(7));
  if (view.name.rfind("embed.", 0) == 0 && model.shard.has_embedding) return kUnitEmbedding;
  return kUnitHead;
}

int64_t ParamLayout::optimizer_floats() const {
  int64_t total = 0;
  for (const FlatRange& r : optimizer_ranges) total += r.count;
  return total;
}

int64_t ParamLayout::packed_offset(int64_t offset) const {
  int64_t packed = 0;
  for (const FlatRange& r : optimizer_ranges) {
    if (offset >= r.offset && offset < r.offset + r.count) return packed + offset - r.offset;
    packed += r.count;
  }
  throw Error(fmt::format("parameter offset {} is in none of this rank's pieces", offset));
}

ParamLayout param_layout_build(const Plan& plan, const Model& model, const RankSchedule& schedule, bool tied_sync) {
  const PlanStage& stage = plan.stages[schedule.stage];
  ParamLayout layout;
  layout.sharded = stage.zero >= 1 && stage.dp > 1;
  layout.experts = experts_range(model);
  layout.experts_sharded = layout.experts.count > 0 && layout.sharded;
  for (const ScheduleOp& op : schedule.ops) {
    if (op.kind != OpKind::OpKind_all_reduce && op.kind != OpKind::OpKind_reduce_scatter) continue;
    // Sharded gradients reduce every bucket once per micro-batch: one entry per bucket.
    const bool seen = std::any_of(layout.buckets.begin(), layout.buckets.end(), [&](const GradientBucket& b) {
      return b.chunk == op.chunk && b.bucket == op.bucket;
    });
    if (seen) continue;
    for (const FlatRange& part : param_ranges_by_place(model, bucket_range(model, stage, op, tied_sync))) {
      GradientBucket b;
      b.chunk = op.chunk;
      b.bucket = op.bucket;
      b.block_begin = op.block_begin;
      b.block_end = op.block_end;
      b.range = part;
      for (int d = 0; d < stage.dp; ++d) {
        const auto [begin, end] = stage.zero_piece(plan.micro_batch_sequences, b.range.count, d);
        b.piece_counts.push_back(end - begin);
        if (d == schedule.dp_rank) b.owned = {b.range.offset + begin, end - begin};
      }
      layout.buckets.push_back(std::move(b));
    }
    // The bucket's routed experts, a place at a time as well (an offloaded block's lie in its host memory).
    const FlatRange experts = layout.experts_sharded ? bucket_experts_range(model, op) : FlatRange{};
    if (experts.count > 0)
      for (const FlatRange& part : param_ranges_by_place(model, experts))
        layout.buckets.push_back(experts_bucket(stage, op, part, schedule.dp_rank));
  }
  if (tied_sync) layout.tied_embedding = {model_view(model, "embed.token").offset, model_view(model, "embed.token").numel};

  // Ranges this rank reduces as a data-parallel member: its pieces when sharded, else all.
  std::vector<FlatRange> mine;
  if (layout.sharded) {
    for (const GradientBucket& b : layout.buckets) mine.push_back(b.owned);
    if (layout.tied_embedding.count > 0) mine.push_back(layout.tied_embedding);
    if (layout.experts.count > 0 && !layout.experts_sharded) mine.push_back(layout.experts);
    std::sort(mine.begin(), mine.end(), [](const FlatRange& a, const FlatRange& b) { return a.offset < b.offset; });
    layout.optimizer_ranges = mine;
  } else {
    mine.push_back({0, model.num_parameters});
    layout.optimizer_ranges = mine;
  }
  // Norm: every gradient element counted by exactly one rank of the job.
  const bool dp_counts = layout.sharded || schedule.dp_rank == 0;
  for (const TensorView& view : model.views) {
    const FlatRange range{view.offset, view.numel};
    if (model.shard.tp_rank != 0 && shard_split_of(view.name) == ShardSplit::ShardSplit_replicated) continue;
    if (model.shard.experts_split() && shard_is_routed_expert(view.name)) {
      if (layout.experts_sharded) {
        add_intersections(layout.norm_ranges, range, mine);  // each member its pieces
      } else if (schedule.dp_rank < stage.ep) {
        layout.norm_ranges.push_back(range);  // the first expert-parallel group
      }
      continue;
    }
    if (tied_sync && view.name == "embed.token") {
      if (stage.has_embedding && schedule.dp_rank == 0) layout.norm_ranges.push_back(range);
      continue;
    }
    if (dp_counts) add_intersections(layout.norm_ranges, range, mine);
  }
  return layout;
}

}  // namespace alloy
