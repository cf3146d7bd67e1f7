// Offload in the cost model: what a stage's offloaded blocks weigh (an MoE model's leading dense
// blocks at their own size) and the host-link time of their copies that compute does not hide.
#include <algorithm>

#include "cost/cost_model.hpp"

namespace alloy {

namespace {

// Link seconds of one offloaded block's backward beside parked activations (0 without weight
// offload). It fetches the weights again plus the gradients accumulated by the step's earlier
// micro-batches ((m - 1) / m of the time) while it writes the new ones back; with depth 1 priced
// as if the directions took turns (an upper bound), deeper windows overlapping them.
double weights_backward_link_seconds(const StageUnitCosts& u, const StageChoice& c) {
  if (c.offloaded <= 0) return 0;
  const double m = std::max(1, c.micro_batches);
  const double fetch_in = u.offload_weights_seconds + u.offload_gradients_seconds * (m - 1.0) / m;
  return c.prefetch_depth <= 1 ? fetch_in + u.offload_gradients_seconds
                               : std::max(fetch_in, u.offload_gradients_seconds);
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
    const int resident_dense = c.dense_blocks - c.dense_offloaded;
    const int resident_moe = c.blocks - c.offloaded - resident_dense;
    OffloadedPasses passes;
    passes.first = {c.dense_offloaded, dense.offload_weights_seconds, dense.offload_gradients_seconds,
                    dense.times.forward_seconds, dense.times.backward_seconds};
    passes.then = {c.offloaded - c.dense_offloaded, u.offload_weights_seconds, u.offload_gradients_seconds,
                   u.block.forward_seconds, u.block.backward_seconds};
    passes.before_forward_seconds = c.has_embedding ? u.embedding.forward_seconds : 0;
    passes.after_forward_seconds = resident_moe * u.block.forward_seconds +
                                   resident_dense * dense.times.forward_seconds +
                                   (c.has_head ? u.head.forward_seconds : 0);
    passes.before_backward_seconds = resident_moe * u.block.backward_seconds +
                                     resident_dense * dense.times.backward_seconds +
                                     (c.has_head ? u.head.backward_seconds : 0);
    passes.after_backward_seconds = c.has_embedding ? u.embedding.backward_seconds : 0;
    // Recomputation, and waits for other stages, would hide more of the copies; leaving them out
    // keeps the estimate an upper bound and the time separable in the recomputation counts.
    t = offload_window_exposure(passes, c.prefetch_depth, c.micro_batches);
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

namespace {

// The offload window over a step's uses, in time from the step's start (when the fetch thread
// starts): the compute's clock, each thread's, and when each slot and each block's last
// write-back come free. The planner runs it in its inner loop: its buffers are the thread's,
// reused from one evaluation to the next.
class OffloadWindowClock {
 public:
  OffloadWindowClock(int slots, int blocks) : slots_(static_cast<size_t>(slots)) {
    thread_local std::vector<double> slot_free, written_back;
    slot_free.assign(slots_, 0.0);
    written_back.assign(static_cast<size_t>(blocks), 0.0);
    slot_free_ = slot_free.data();
    written_back_ = written_back.data();
  }
  void compute(double seconds) { now_ += seconds; }
  // One use of `block`, whose fetch takes `fetch_seconds`; a backward writes back for
  // `write_back_seconds` after its compute. Returns the seconds the compute waited.
  double use(int block, double fetch_seconds, double compute_seconds, bool backward, double write_back_seconds) {
    double& slot = slot_free_[next_slot_];  // freed by the use `slots` before
    next_slot_ = next_slot_ + 1 == slots_ ? 0 : next_slot_ + 1;
    double& block_home = written_back_[block];
    double start = std::max(fetch_free_, slot);
    if (backward) start = std::max(start, block_home);
    fetch_free_ = start + fetch_seconds;
    const double waited = std::max(0.0, fetch_free_ - now_);
    now_ += waited + compute_seconds;
    slot = now_;
    if (backward) {
      write_free_ = std::max(write_free_, now_) + write_back_seconds;
      slot = block_home = write_free_;
    }
    return waited;
  }

 private:
  size_t slots_;
  size_t next_slot_ = 0;
  double* slot_free_;
  double* written_back_;  // per offloaded block, in forward order
  double now_ = 0;
  double fetch_free_ = 0;
  double write_free_ = 0;
};

// One micro-batch's forward then backward through `clock`; `accumulated`: the backward also
// fetches the gradients so far (every micro-batch after the step's first).
OffloadExposure offload_window_micro_batch(const OffloadedPasses& p, bool accumulated, OffloadWindowClock* clock) {
  const OffloadedBlockKind* kinds[2] = {&p.first, &p.then};
  OffloadExposure waited;
  clock->compute(p.before_forward_seconds);
  int block = 0;
  for (const OffloadedBlockKind* k : kinds)
    for (int i = 0; i < k->count; ++i, ++block)
      waited.forward_seconds += clock->use(block, k->weights_seconds, k->forward_seconds, false, 0);
  clock->compute(p.after_forward_seconds + p.before_backward_seconds);
  for (const OffloadedBlockKind* k : {kinds[1], kinds[0]}) {
    const double fetch = k->weights_seconds + (accumulated ? k->gradients_seconds : 0.0);
    for (int i = 0; i < k->count; ++i)
      waited.backward_seconds += clock->use(--block, fetch, k->backward_seconds, true, k->gradients_seconds);
  }
  clock->compute(p.after_backward_seconds);
  return waited;
}

// offload_window_exposure without its memory of the last call.
OffloadExposure run_offload_window(const OffloadedPasses& passes, int depth, int micro_batches) {
  const int blocks = passes.first.count + passes.then.count;
  // The first micro-batch fetches no gradients, the second follows it; the third follows one like
  // itself and stands for the rest of the step.
  constexpr int kMicroBatchesRun = 3;
  OffloadWindowClock clock(std::min(std::max(1, depth) + 1, blocks), blocks);
  const int m = std::max(1, micro_batches);
  OffloadExposure total, last;
  for (int mb = 0; mb < std::min(m, kMicroBatchesRun); ++mb) {
    last = offload_window_micro_batch(passes, mb > 0, &clock);
    total.forward_seconds += last.forward_seconds;
    total.backward_seconds += last.backward_seconds;
  }
  const int rest = std::max(0, m - kMicroBatchesRun);
  return {(total.forward_seconds + rest * last.forward_seconds) / m,
          (total.backward_seconds + rest * last.backward_seconds) / m};
}

}  // namespace

OffloadExposure offload_window_exposure(const OffloadedPasses& passes, int depth, int micro_batches) {
  const int blocks = passes.first.count + passes.then.count;
  if (blocks <= 0) return {};
  // The planner prices a stage's recomputation choices one after another at the same offload
  // setting, which this does not depend on: the thread's last answer is often the next.
  struct Last {
    OffloadedPasses passes;
    int depth = 0;
    int micro_batches = 0;
    OffloadExposure exposure;
  };
  thread_local Last last_call;
  if (last_call.depth == depth && last_call.micro_batches == micro_batches && last_call.passes == passes)
    return last_call.exposure;
  last_call.exposure = run_offload_window(passes, depth, micro_batches);
  last_call.passes = passes;
  last_call.depth = depth;
  last_call.micro_batches = micro_batches;
  return last_call.exposure;
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
