// Offload in the cost model: what a stage's offloaded blocks weigh (an MoE model's leading dense
// blocks at their own size) and the host-link time of their copies that compute does not hide.
#include <algorithm>

#include "cost/cost_model.hpp"

namespace alloy {

namespace {

// Link seconds of one offloaded block's backward (0 without weight offload). It fetches the
// weights again plus the gradients accumulated by the step's earlier micro-batches ((m - 1) / m
// of the time) while it writes the new ones back. With depth 1 the window's two slots serialise
// the directions: the next fetch needs the slot whose gradients are still being written back.
// Deeper windows overlap them. For a block whose weights take `weights_seconds` on the link and
// its gradients `gradients_seconds`.
double weights_backward_link_seconds(double weights_seconds, double gradients_seconds, const StageChoice& c) {
  if (c.offloaded <= 0) return 0;
  const double m = std::max(1, c.micro_batches);
  const double fetch_in = weights_seconds + gradients_seconds * (m - 1.0) / m;
  return c.prefetch_depth <= 1 ? fetch_in + gradients_seconds : std::max(fetch_in, gradients_seconds);
}

double weights_backward_link_seconds(const StageUnitCosts& u, const StageChoice& c) {
  return weights_backward_link_seconds(u.offload_weights_seconds, u.offload_gradients_seconds, c);
}

}  // namespace

double stage_offloaded_parameters(const StageUnitCosts& u, const StageChoice& c) {
  return (c.offloaded - c.dense_offloaded) * u.block_parameters + c.dense_offloaded * u.dense_block.parameters;
}

double stage_offloaded_expert_parameters(const StageUnitCosts& u, const StageChoice& c) {
  return (c.offloaded - c.dense_offloaded) * u.block_expert_parameters;
}

OffloadExposure CostModel::stage_offload_exposure(const StageUnitCosts& u, const StageChoice& c) const {
  OffloadExposure t;
  if (c.offloaded > 0) {
    // An MoE model's leading dense blocks lead the offloaded run forward and close it backward,
    // each priced at its own size.
    const DenseBlockCosts& dense = u.dense_block;
    const int moe_offloaded = c.offloaded - c.dense_offloaded;
    const OffloadedRun dense_forward{c.dense_offloaded, dense.offload_weights_seconds, dense.times.forward_seconds};
    const OffloadedRun moe_forward{moe_offloaded, u.offload_weights_seconds, u.block.forward_seconds};
    const OffloadedRun dense_backward{
        c.dense_offloaded, weights_backward_link_seconds(dense.offload_weights_seconds, dense.offload_gradients_seconds, c),
        dense.times.backward_seconds};
    const OffloadedRun moe_backward{moe_offloaded, weights_backward_link_seconds(u, c), u.block.backward_seconds};
    // The first fetches hide behind the work that precedes the offloaded run inside its own
    // pass, whatever the schedule puts before the pass: the embedding in forward (the offloaded
    // blocks come first), the head and the resident blocks in backward (they come last).
    const int resident_dense = c.dense_blocks - c.dense_offloaded;
    const int resident_moe = c.blocks - c.offloaded - resident_dense;
    const double before_forward = c.has_embedding ? u.embedding.forward_seconds : 0;
    const double before_backward = resident_moe * u.block.backward_seconds + resident_dense * dense.times.backward_seconds +
                                   (c.has_head ? u.head.backward_seconds : 0);
    // Recomputation would hide more of the backward copies; leaving it out keeps the estimate an
    // upper bound and the time separable in the recomputation counts.
    t.forward_seconds = offload_exposed_seconds(dense_forward, moe_forward, c.prefetch_depth, before_forward);
    t.backward_seconds = offload_exposed_seconds(moe_backward, dense_backward, c.prefetch_depth, before_backward);
  }
  const int parked = c.parked_selective + c.parked_none;
  if (parked > 0) {
    // Parked activations leave after each forward (the other direction from weight fetches; a
    // forward waits once `depth` are on their way out) and come back ahead of the backward,
    // sharing the way in with the weights.
    // Blocks with weights and activations in host memory are priced as if they were the same
    // blocks (their copies add up on the way in), and as the larger kind: an upper bound.
    const double activations = c.parked_none > 0 ? u.activations_link_seconds[0] : u.activations_link_seconds[1];
    t.forward_seconds +=
        std::max(0, parked - c.prefetch_depth) * std::max(0.0, activations - u.block.forward_seconds);
    const double weights_in = c.offloaded > 0 ? t.backward_seconds : 0;
    const double resident = c.blocks - parked;
    const double before_backward = resident * u.block.backward_seconds + (c.has_head ? u.head.backward_seconds : 0);
    t.backward_seconds = std::max(weights_in, offload_exposed_seconds(std::max(parked, c.offloaded), c.prefetch_depth,
                                                                      activations + weights_backward_link_seconds(u, c),
                                                                      u.block.backward_seconds, before_backward));
  }
  return t;
}

double offload_exposed_seconds(int offloaded, int depth, double transfer_seconds, double compute_seconds,
                               double window_compute_seconds) {
  return offload_exposed_seconds(OffloadedRun{offloaded, transfer_seconds, compute_seconds}, OffloadedRun{}, depth,
                                 window_compute_seconds);
}

double offload_exposed_seconds(const OffloadedRun& first, const OffloadedRun& then, int depth,
                               double window_compute_seconds) {
  if (first.count + then.count <= 0) return 0;
  const OffloadedRun& opening = first.count > 0 ? first : then;
  const auto excess = [](const OffloadedRun& r) { return std::max(0.0, r.transfer_seconds - r.compute_seconds); };
  const double later = (opening.count - 1) * excess(opening) + (first.count > 0 ? then.count * excess(then) : 0.0);
  const double head_start = std::min(window_compute_seconds, std::max(1, depth) * opening.transfer_seconds);
  return std::max(0.0, opening.transfer_seconds + later - head_start);
}

}  // namespace alloy
