// The gradient side of the cost model: the buckets a stage's backward is cut into and the
// exposed reduction per step of each gradient strategy.
#include "cost/cost_model.hpp"
#include "spec/units.hpp"

#include <algorithm>
#include <cmath>

namespace alloy {

namespace {

// Share of a backward (and, for sharded gradients' earlier micro-batches, the next forward)
// that can hide bucketed gradient reduction.
constexpr double kGradientOverlapFraction = 0.9;

// `first` and `last`: the extra bytes the first and last block carry (the embedding, the head);
// `block_bytes`: one block's; `bucket_bytes`: the schedule's target.
StageBuckets stage_buckets(double bucket_bytes, double block_bytes, int blocks, double first, double last) {
  StageBuckets out;
  if (blocks <= 0 || block_bytes <= 0) {
    out.count = 1;
    out.last_bytes = out.largest_bytes = blocks * block_bytes + first + last;
    return out;
  }
  // The first bucket closed (with the last block's extra) takes k1 blocks, every later one k.
  const int k1 = std::max(1, static_cast<int>(std::ceil((bucket_bytes - last) / block_bytes)));
  const int k = std::max(1, static_cast<int>(std::ceil(bucket_bytes / block_bytes)));
  if (blocks <= k1) {
    out.count = 1;
    out.last_bytes = out.largest_bytes = blocks * block_bytes + first + last;
    return out;
  }
  const int rest = blocks - k1;
  const int left = rest % k;
  out.count = 1 + rest / k + (left > 0 ? 1 : 0);
  out.last_bytes = (left == 0 ? k : left) * block_bytes + first;
  const double middle = rest / k > (left == 0 ? 1 : 0) ? k * block_bytes : 0;
  out.largest_bytes = std::max({k1 * block_bytes + last, middle, out.last_bytes});
  return out;
}

}  // namespace

bool stage_gradients_sharded(const StageShape& shape, const StageChoice& choice) {
  return choice.shard_gradients && choice.zero >= 2 && shape.dp > 1;
}

double CostModel::gradient_element_bytes() const {
  const double e = precision_bytes(train_.precision);
  return train_.master_weights_fp32 && e < 4 ? 4.0 : e;
}

double CostModel::gradient_wire_bytes(int zero) const {
  const bool bf16_wire = zero >= 2 && train_.gradient_communication == Precision::Precision_bf16;
  return bf16_wire ? std::min(gradient_element_bytes(), 2.0) : gradient_element_bytes();
}

StageBuckets CostModel::stage_gradient_buckets(const StageShape& shape, const StageUnitCosts& u,
                                               const StageChoice& c) const {
  const double e = gradient_element_bytes();
  const double params = stage_parameters(shape, u, c);
  const double embedding_bytes = c.has_embedding ? u.embedding_parameters * e : 0;
  const double block_bytes = stage_blocks_sum(c, u.block_parameters, u.dense_block.parameters) * e;
  const double head_bytes = std::max(0.0, params * e - block_bytes - embedding_bytes);
  // An MoE model's leading dense blocks are smaller: the buckets take the stage's mean block.
  return stage_buckets(train_.gradient_bucket_mib * kMiB, c.blocks > 0 ? block_bytes / c.blocks : 0, c.blocks,
                       embedding_bytes, head_bytes);
}

double CostModel::earlier_reduce_scatter_seconds(const StageShape& shape, const StageUnitCosts& u, const StageChoice& c,
                                                 double reduce, double last_bucket) const {
  // Collectives that reduce on the cores that compute hide nothing.
  if (runtime_traits(cluster_.device_types[shape.device_type]).collectives_share_compute_cores) return reduce;
  const double n = c.blocks;
  const double plain_backward = stage_blocks_sum(c, u.block.backward_seconds, u.dense_block.times.backward_seconds) +
                                (c.has_embedding ? u.embedding.backward_seconds : 0) +
                                (c.has_head ? u.head.backward_seconds : 0);
  const double plain_forward = stage_blocks_sum(c, u.block.forward_seconds, u.dense_block.times.forward_seconds) +
                               (c.has_embedding ? u.embedding.forward_seconds : 0) +
                               (c.has_head ? u.head.forward_seconds : 0);
  if (c.zero >= 3) {
    // The reductions share the collective stream with the backward's weight gathers, and the
    // next forward's first gather queues behind the last bucket: that one shows whole.
    const double gathers = n * group_seconds(shape.device_type, CollectiveOp::CollectiveOp_all_gather,
                                             u.block_parameters * precision_bytes(train_.precision), shape.dp_group);
    return std::max({0.0, reduce - kGradientOverlapFraction * std::max(0.0, plain_backward - gathers), last_bucket});
  }
  // Buckets reduce behind the rest of the backward and the next forward; the last one, posted
  // after the backward, behind the forward alone.
  return std::max({0.0, reduce - kGradientOverlapFraction * (plain_backward + plain_forward),
                   last_bucket - kGradientOverlapFraction * plain_forward});
}

GradientReduceBound CostModel::stage_gradient_reduce_bound(const StageShape& shape) const {
  if (shape.dp <= 1 || model_is_moe(model_)) return {};
  // A stage's reduction moves at least its blocks' gradients: all-reduced as accumulated under
  // ZeRO 0-1, reduce-scattered at the wire precision under ZeRO 2-3.
  const double block_parameters_per_device = static_cast<double>(block_parameters(model_)) / shape.tp;
  const auto least = [&](double blocks) {
    const double parameters = blocks * block_parameters_per_device;
    return std::min(group_seconds(shape.device_type, CollectiveOp::CollectiveOp_all_reduce,
                                  parameters * gradient_wire_bytes(0), shape.dp_group, false),
                    group_seconds(shape.device_type, CollectiveOp::CollectiveOp_reduce_scatter,
                                  parameters * gradient_wire_bytes(2), shape.dp_group, false));
  };
  const int most = static_cast<int>(model_.num_layers);
  GradientReduceBound out;
  out.one_block_seconds = least(1);
  out.fixed_seconds = out.one_block_seconds;
  // Every analytic algorithm is affine in the bytes, and the fastest of them concave: on [1, most]
  // the chord lies below. A measured profile's times only grow with the bytes.
  if (!profile_collectives_price(shape.dp_group) && most > 1) {
    out.per_block_seconds = std::max(0.0, (least(most) - out.one_block_seconds) / (most - 1));
    out.fixed_seconds -= out.per_block_seconds;
  }
  return out;
}

GradientSyncBound CostModel::stage_gradient_sync_bound(const GradientReduceBound& reduce, const StageUnitCosts& unit,
                                                       bool embedding, bool head) const {
  // stage_gradient_sync_seconds: at least the reduction less the backward that hides it, and at
  // least the last bucket, which holds one block's gradients or more.
  GradientSyncBound out;
  out.floor_seconds = reduce.one_block_seconds;
  out.fixed_seconds = reduce.fixed_seconds - kGradientOverlapFraction * ((embedding ? unit.embedding.backward_seconds : 0) +
                                                                         (head ? unit.head.backward_seconds : 0));
  out.per_block_seconds = reduce.per_block_seconds - kGradientOverlapFraction * unit.block.backward_seconds;
  if (out.per_block_seconds < 0) {  // least at the most blocks
    out.fixed_seconds += out.per_block_seconds * static_cast<double>(model_.num_layers);
    out.per_block_seconds = 0;
  }
  return out;
}

double CostModel::stage_gradient_sync_seconds(const StageShape& shape, const StageUnitCosts& u,
                                              const StageChoice& c) const {
  if (shape.dp <= 1) return 0;
  // Gradient reduction overlaps the last backward, bucket by bucket; ZeRO-1/2 also re-gather the
  // updated weights (ZeRO-3 gathers them on use). Alloy's runtime all-reduces under ZeRO 0-1 and
  // reduce-scatters under ZeRO 2-3 (docs/runtime-distributed.md), so ZeRO 1 moves more than
  // ZeRO 2 for the same memory. Accumulated gradients are reduced once per step, after the last
  // micro-batch's backward; sharded ones after every micro-batch's.
  // Gradients accumulate and reduce in fp32 beside fp32 master weights (Alloy's runtimes, as
  // Megatron-LM, DeepSpeed's bf16 optimizer and FSDP's default reduce dtype do); ZeRO 2-3
  // reduce-scatters send bf16 where the training file asks (gradient_communication).
  const double e = precision_bytes(train_.precision);
  const double accumulated = gradient_element_bytes();
  const double params = stage_parameters(shape, u, c);
  const double wire = gradient_wire_bytes(c.zero);
  const double grad_bytes = params * wire;
  const CollectiveOp op = c.zero <= 1 ? CollectiveOp::CollectiveOp_all_reduce : CollectiveOp::CollectiveOp_reduce_scatter;
  // MoE: the routed experts' gradients reduce over the members holding the same experts.
  const double expert_bytes = (c.blocks - c.dense_blocks) * u.block_expert_parameters * wire;
  const double reduce = group_seconds(shape.device_type, op, grad_bytes - expert_bytes, shape.dp_group) +
                        group_seconds(shape.device_type, op, expert_bytes, shape.expert_dp_group);
  const double last_bytes = stage_gradient_buckets(shape, u, c).last_bytes * wire / accumulated;
  const double last_bucket =
      last_bytes >= grad_bytes ? reduce : group_seconds(shape.device_type, op, last_bytes, shape.dp_group);
  // The window is the plain backward (recomputation and transfers excluded), so the exposed
  // sync depends on the stage's layers and shape only.
  const double plain_backward = stage_blocks_sum(c, u.block.backward_seconds, u.dense_block.times.backward_seconds) +
                                (c.has_embedding ? u.embedding.backward_seconds : 0) +
                                (c.has_head ? u.head.backward_seconds : 0);
  const double window = kGradientOverlapFraction * plain_backward;
  // The last bucket starts after the backward: nothing hides it (one bucket for a model under
  // 64 MiB of gradients, e.g. small-gpt's 17 MB, whose reduce-scatter over 4 CPU ranks took 34 ms).
  double sync = std::max({0.0, reduce - window, last_bucket});
  if (stage_gradients_sharded(shape, c) && c.micro_batches > 1)
    sync += (c.micro_batches - 1) * earlier_reduce_scatter_seconds(shape, u, c, reduce, last_bucket);
  if (c.zero == 1 || c.zero == 2)
    sync += group_seconds(shape.device_type, CollectiveOp::CollectiveOp_all_gather, (params - expert_bytes / wire) * e,
                          shape.dp_group) +
            group_seconds(shape.device_type, CollectiveOp::CollectiveOp_all_gather, expert_bytes / wire * e,
                          shape.expert_dp_group);
  return sync;
}

}  // namespace alloy
