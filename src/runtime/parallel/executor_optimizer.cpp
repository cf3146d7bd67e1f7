// The rank's optimizer op: the tied table's and the sequence-parallel norms' sums, the global
// gradient norm with its finiteness check, and AdamW over the optimizer's spans. Gradients are
// read where this rank keeps them: the backend's flat buffer, or the shard of sharded gradients.
#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "runtime/cpu/optimizer.hpp"
#include "runtime/parallel/executor.hpp"
#include "runtime/parallel/zero_gradients.hpp"
#include "spec/error.hpp"

namespace alloy {

float* RankRuntime::gradients_at(int64_t offset, int64_t count) {
  return sharded_ ? sharded_->shard_at(offset, count) : backend_->gradients_at(offset, count);
}

std::vector<FlatRange> RankRuntime::gradient_pieces(const FlatRange& range) const {
  if (!sharded_) return {range};
  std::vector<FlatRange> pieces;
  for (const FlatRange& r : layout_.optimizer_ranges) {
    const int64_t begin = std::max(range.offset, r.offset);
    const int64_t end = std::min(range.offset + range.count, r.offset + r.count);
    if (begin < end) pieces.push_back({begin, end - begin});
  }
  return pieces;
}

double RankRuntime::gradient_square_sum() {
  std::vector<FloatSpan> spans;
  for (const FlatRange& r : layout_.norm_ranges) spans.push_back({gradients_at(r.offset, r.count), r.count});
  return backend_->square_sum(spans);
}

void RankRuntime::optimizer(RankStepStats& stats) {
  if (layout_.tied_embedding.count > 0) sum_tied_embedding(stats);
  if (layout_.experts.count > 0 && !layout_.experts_sharded && groups_.expert_dp.size() > 1) sum_expert_gradients(stats);
  const Model& model = backend_->model();
  if (model.shard.sequence_parallel && model.shard.tp > 1) sum_sequence_parallel_norms(stats);
  if (poison_gradient_) gradient_poison();
  // The squares and the losses summed over every rank: NaN or Inf in any rank's loss or counted
  // gradient makes a sum non-finite on every rank, so all skip the update alike, for one more
  // double in the norm's all-reduce. The losses are taken here (all of the rank's forwards have
  // run); taking them fences the backend's queued work.
  const PassLossSums losses = backend_->take_loss_sums();
  if (schedule_.tp_rank == 0) {
    stats.loss_sum = losses.cross_entropy;
    stats.aux_loss_sum = losses.balance;
  }
  double sums[2] = {gradient_square_sum(), losses.cross_entropy + losses.balance};  // squares, losses
  wait(control_.all_reduce(sums, 2, control_.world()), stats);
  // The gradients hold loss_scale times the true ones: the norm is theirs over the scale.
  const double scale = loss_scaler_.scale;
  stats.loss_scale = scale;
  const double norm = std::sqrt(sums[0]) / scale;
  const float lr = lr_schedule(optimizer_steps_, train_.learning_rate, train_.min_learning_rate, train_.warmup_steps,
                               train_.steps);
  optimizer_steps_++;
  stats.grad_norm = norm;
  stats.learning_rate = lr;
  stats.loss_finite = std::isfinite(sums[1]);
  stats.update_skipped = !stats.loss_finite || !std::isfinite(sums[0]);
  if (stats.update_skipped) {
    // Every rank saw the same sums, so every rank's scaler decides alike.
    stats.loss_scale_overflow = stats.loss_finite && loss_scaler_.absorb_overflow();
    return;
  }
  loss_scaler_.step_done();
  // The update divides the scale back out of the gradients (exactly, for a power of two).
  const float gradient_scale = static_cast<float>(grad_clip_scale(norm, train_.grad_clip) / scale);
  AdamWHyper hyper{lr, static_cast<float>(train_.beta1), static_cast<float>(train_.beta2),
                   static_cast<float>(train_.adam_eps), 0.0f, gradient_scale};
  if (spans_.empty()) spans_ = update_spans();
  for (const UpdateSpan& span : spans_) {
    hyper.weight_decay = span.decay ? static_cast<float>(train_.weight_decay) : 0.0f;
    const MomentSegment& ms = moments_at(span.packed);
    // ZeRO 3 keeps the device's pieces apart; offloaded blocks' are in their host memory.
    float* params = zero3_ && !ms.on_host ? zero3_->pieces_at(span.offset, span.count)
                                          : backend_->parameters_at(span.offset, span.count);
    backend_->adamw_update(params, ms.m + (span.packed - ms.packed_offset), ms.v + (span.packed - ms.packed_offset),
                           gradients_at(span.offset, span.count), span.count, hyper, optimizer_steps_);
  }
  backend_->parameters_changed();
}

void RankRuntime::loss_scaler_restore(double scale, int64_t good_steps) {
  if (!loss_scaler_.dynamic || !(scale >= 1 && scale <= kLossScaleMost)) return;
  loss_scaler_.scale = scale;
  loss_scaler_.good_steps = good_steps;
}

void RankRuntime::gather_offloaded_parameters() {
  const Model& model = backend_->model();
  for (const GradientBucket& b : layout_.buckets) {
    if (model_offset_on_host(model, b.range.offset))
      pending_gathers_.push_back(comm_.all_gather(backend_->parameters_at(b.range.offset, b.range.count), b.piece_counts, bucket_group(b)));
  }
}

void RankRuntime::gradient_poison() {
  poison_gradient_ = false;
  if (layout_.norm_ranges.empty())
    throw Error(fmt::format("rank {} counts no gradient in the norm, so it has none to poison", comm_.rank()),
                {"", "ALLOY_FAULT"}, "poison a rank that updates parameters of its own");
  const float nan = std::numeric_limits<float>::quiet_NaN();
  backend_->copy_from_host(gradients_at(layout_.norm_ranges.front().offset, 1), &nan, sizeof(float));
}

// The tied table's gradient summed over every replica of the first and last stage. With the
// same tp on both, tp rank t of each holds the same rows; otherwise whole tables are summed,
// each rank placing its rows.
void RankRuntime::sum_tied_embedding(RankStepStats& stats) {
  float* grads = gradients_at(layout_.tied_embedding.offset, layout_.tied_embedding.count);
  if (plan_.stages.front().tp == plan_.stages.back().tp) {
    wait(comm_.all_reduce(grads, layout_.tied_embedding.count, groups_.embedding), stats);
    return;
  }
  const Model& model = backend_->model();
  const int64_t C = model.spec.hidden_size;
  const int64_t table_floats = model.spec.vocab_size * C;
  const auto [begin, end] = shard_vocab_range(model.spec, model.shard.tp, model.shard.tp_rank);
  const int64_t rows_bytes = (end - begin) * C * static_cast<int64_t>(sizeof(float));
  float* table = backend_->arena().allocate_floats(table_floats, "tied embedding gradient sum");
  backend_->fill_zero(table, table_floats);
  backend_->copy(table + begin * C, grads, rows_bytes);
  wait(comm_.all_reduce(table, table_floats, groups_.embedding), stats);
  backend_->copy(grads, table + begin * C, rows_bytes);
  backend_->arena().release(table);
}

// Under expert parallelism each member's routed experts sit outside the data-parallel buckets:
// their gradients (from every member's tokens) are summed over the replicas of the same experts
// (unless sharded, when their own buckets reduce them): a place at a time, as an offloaded
// block's experts are in its host memory.
void RankRuntime::sum_expert_gradients(RankStepStats& stats) {
  for (const FlatRange& part : param_ranges_by_place(backend_->model(), layout_.experts))
    wait(comm_.all_reduce(gradients_at(part.offset, part.count), part.count, groups_.expert_dp), stats);
}

// Under sequence parallelism each rank's block norms saw only its rows: their gradients are
// summed over the tensor-parallel group (packed, as they are spread through the buffer). With
// sharded gradients a rank holds only its pieces of them, and the tp ranks' pieces need not be
// the same elements (an uneven vocabulary split shifts the buckets' pieces): each places its
// pieces in the packed norms, zeros elsewhere, so a sum over dp completes every rank's norms
// before the sum over tp.
void RankRuntime::sum_sequence_parallel_norms(RankStepStats& stats) {
  const Model& model = backend_->model();
  std::vector<const TensorView*> norms;
  int64_t total = 0;
  for (const TensorView& view : model.views) {
    if (view.name.rfind("layers.", 0) == 0 && view.name.find("norm.") != std::string::npos) {
      norms.push_back(&view);
      total += view.numel;
    }
  }
  float* packed = backend_->arena().allocate_floats(total, "sequence-parallel norm gradients");
  if (sharded_) backend_->fill_zero(packed, total);
  const auto pieces_copy = [&](bool to_packed) {
    int64_t at = 0;
    for (const TensorView* view : norms) {
      for (const FlatRange& piece : gradient_pieces({view->offset, view->numel})) {
        float* there = packed + at + (piece.offset - view->offset);
        float* here = gradients_at(piece.offset, piece.count);
        const int64_t bytes = piece.count * static_cast<int64_t>(sizeof(float));
        if (to_packed) {
          backend_->copy(there, here, bytes);
        } else {
          backend_->copy(here, there, bytes);
        }
      }
      at += view->numel;
    }
  };
  pieces_copy(true);
  if (sharded_) wait(comm_.all_reduce(packed, total, groups_.dp), stats);
  wait(comm_.all_reduce(packed, total, groups_.tp), stats);
  pieces_copy(false);
  backend_->arena().release(packed);
}

}  // namespace alloy
