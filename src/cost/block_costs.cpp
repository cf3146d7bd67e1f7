// One block priced by the dense arithmetic on a stage shape (the dense part of an MoE block, or
// an MoE model's leading dense block), and sums over a stage's blocks of the two kinds.
#include <algorithm>

#include "cost/cost_model.hpp"

namespace alloy {

double stage_blocks_sum(const StageChoice& c, double per_block, double per_dense_block) {
  return (c.blocks - c.dense_blocks) * per_block + c.dense_blocks * per_dense_block;
}

void stage_choice_set_dense_blocks(StageChoice* c, int dense_blocks) {
  c->dense_blocks = std::clamp(dense_blocks, 0, c->blocks);
  c->dense_full = std::min(c->dense_blocks, c->full);
  c->dense_selective = std::min(c->dense_blocks - c->dense_full, c->selective);
  c->dense_offloaded = std::min(c->dense_blocks, c->offloaded);
}

DenseBlockCosts CostModel::dense_block_costs(const ModelSpec& m, const StageShape& shape, bool sp,
                                             bool mlp_sums_over_tp) const {
  // A device without fp8 runs an fp8 plan's products in bf16, and casts nothing.
  const bool fp8_here = precision_run_on(cluster_.device_types[shape.device_type], train_.precision) ==
                        Precision::Precision_fp8;
  const Precision p = train_.precision == Precision::Precision_fp8 && !fp8_here ? Precision::Precision_bf16
                                                                                : train_.precision;
  const int64_t b = shape.micro_batch;
  const int64_t s = train_.seq_len;
  const int tp = shape.tp;
  DenseBlockCosts out;
  const RuntimeTraits& runtime = runtime_traits(cluster_.device_types[shape.device_type]);
  const LayerWork block =
      block_work(m, b, s, tp, sp, p, runtime.elementwise_kernels, runtime.selective_recompute, runtime.fp8_weight_casts);
  out.compute = layer_times(shape, LayerKind::LayerKind_block, sp, block);
  if (p == Precision::Precision_fp8 && runtime.fp8_weight_casts == Fp8WeightCasts::Fp8WeightCasts_once_per_step) {
    LayerWork casts;
    casts.forward_bytes = casts.forward_elementwise_bytes = fp8_weight_cast_bytes_per_step(m, tp);
    out.fp8_weight_cast_seconds = compute_seconds(priced_types_[shape.device_type], p, casts, false);
  }
  out.times = out.compute;
  // Each pass sums over tp after the attention's output projection and, where the MLP is split
  // over tp, after its down projection (forward) or its up projection's input gradient
  // (backward): all-reduces, or reduce-scatters under sequence parallelism, which also gathers
  // both norms' outputs in forward and the output gradient before each half's backward. An MoE
  // block's MLP runs whole on every tp rank (model_pass.cpp): no sum of its own. Full
  // recomputation stops before the MLP's output, so it redoes the attention's sum (and, under
  // sequence parallelism, both gathers) but not the MLP's.
  // A runtime that gathers in fp8 moves one byte per element in them; the sums stay 16-bit.
  double tp_collectives = 0, recompute_collectives = 0;
  if (tp > 1) {
    const double hidden = hidden_state_bytes(m, b, s, p);
    const double gathered = fp8_here && runtime.fp8_tensor_parallel_gathers ? hidden / precision_bytes(p) : hidden;
    const auto seconds = [&](CollectiveOp op, double bytes) { return group_seconds(shape.device_type, op, bytes, shape.tp_group); };
    const double gather = sp ? seconds(CollectiveOp::CollectiveOp_all_gather, gathered) : 0;
    const double sum = seconds(sp ? CollectiveOp::CollectiveOp_reduce_scatter : CollectiveOp::CollectiveOp_all_reduce, hidden);
    tp_collectives = 2.0 * gather + (mlp_sums_over_tp ? 2.0 : 1.0) * sum;
    recompute_collectives = 2.0 * gather + sum;
  }
  out.times.forward_seconds += tp_collectives;
  out.times.backward_seconds += tp_collectives;
  // Recomputing the attention core reruns its share of the forward; recomputing all but the
  // kept matrix products reruns those products and every element-wise kernel of the block.
  out.recompute_selective_seconds =
      runtime.selective_recompute == SelectiveRecompute::SelectiveRecompute_attention_core
          ? out.compute.forward_seconds * recompute_forward_share(block, Recompute::Recompute_selective)
          : compute_seconds(priced_types_[shape.device_type], p, alternate_matmuls_recompute_work(block), false);
  out.recompute_full_seconds =
      out.compute.forward_seconds * recompute_forward_share(block, Recompute::Recompute_full) + recompute_collectives;
  out.parameters = static_cast<double>(block_parameters(m)) / tp;
  for (Recompute r : {Recompute::Recompute_none, Recompute::Recompute_selective, Recompute::Recompute_full})
    out.activation_bytes[static_cast<int>(r)] =
        block_activation_bytes(m, b, s, tp, sp, r, p, runtime.attention_memory, runtime.selective_recompute);
  out.backward_workspace_bytes = runtime.backward_workspace == BackwardWorkspace::BackwardWorkspace_fused
                                     ? block_backward_workspace_bytes(m, b, s, tp, p)
                                     : cpu_block_backward_workspace_bytes(m, b, s, tp, sp, p);
  return out;
}

}  // namespace alloy
