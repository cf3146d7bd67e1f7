// A rank's state seen from outside its steps: where the AdamW moments live and how the optimizer
// walks them, the checkpoint's views of parameters and moments (through host copies on a
// backend whose memory is not the host's), and the rank's full parameters.
#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "runtime/parallel/agree.hpp"
#include "runtime/parallel/executor.hpp"
#include "runtime/parallel/reshard.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace {

bool floats_finite(const float* data, int64_t count) {
  for (int64_t i = 0; i < count; ++i)
    if (!std::isfinite(data[i])) return false;
  return true;
}

// The name of the first of `refs` (in host memory) holding NaN or Inf, or "".
std::string first_nonfinite(const std::vector<TensorRef>& refs) {
  for (const TensorRef& r : refs)
    if (!floats_finite(r.data, tensor_ref_numel(r))) return r.name;
  return "";
}

// Resuming from NaN or Inf would only train on them (a checkpoint written before they were
// refused): names the file and tensor. parameters, moments: as loaded, in host memory.
void checkpoint_check_finite(const std::string& dir, const std::vector<TensorRef>& parameters,
                             const std::vector<TensorRef>& moments) {
  for (const auto& [refs, file] :
       {std::pair{&parameters, kCheckpointModelFile}, std::pair{&moments, kCheckpointOptimizerFile}}) {
    const std::string bad = first_nonfinite(*refs);
    if (!bad.empty())
      throw Error(fmt::format("the checkpoint's {} holds NaN or Inf", bad), {dir + "/" + file, bad},
                  "resume from a checkpoint saved before the numbers diverged, or start afresh without --resume");
  }
}

}  // namespace

// The AdamW moments of the packed optimizer ranges, a segment per run of them in one place: the
// device's runs join into one (a single segment without weight offload), each offloaded block's
// part is a segment in host memory.
void RankRuntime::build_moments() {
  const Model& model = backend_->model();
  int64_t packed = 0;
  for (const FlatRange& r : layout_.optimizer_ranges) {
    for (const ParameterSegment& p : model.segments) {
      const int64_t begin = std::max(r.offset, p.offset);
      const int64_t end = std::min(r.offset + r.count, p.offset + p.count);
      if (begin >= end) continue;
      const int64_t at = packed + begin - r.offset;
      const bool on_host = p.host_block >= 0;
      const bool joins = !moments_.empty() && !on_host && !moments_.back().on_host &&
                         moments_.back().packed_offset + moments_.back().count == at;
      if (joins) {
        moments_.back().count += end - begin;
      } else {
        moments_.push_back({at, end - begin, nullptr, nullptr, on_host});
      }
    }
    packed += r.count;
  }
  if (moments_.empty()) moments_.push_back({0, 0, nullptr, nullptr, false});  // a member without a piece
  for (MomentSegment& ms : moments_) {
    if (ms.on_host) {
      ms.m = host_arena_->allocate_floats(ms.count, "offloaded adamw.m");
      ms.v = host_arena_->allocate_floats(ms.count, "offloaded adamw.v");
      std::memset(ms.m, 0, static_cast<size_t>(ms.count) * sizeof(float));
      std::memset(ms.v, 0, static_cast<size_t>(ms.count) * sizeof(float));
    } else {
      ms.m = backend_->arena().allocate_floats(ms.count, "adamw.m");
      ms.v = backend_->arena().allocate_floats(ms.count, "adamw.v");
      backend_->fill_zero(ms.m, ms.count);
      backend_->fill_zero(ms.v, ms.count);
    }
  }
}

const MomentSegment& RankRuntime::moments_at(int64_t packed) const {
  for (const MomentSegment& ms : moments_)
    if (packed >= ms.packed_offset && packed < ms.packed_offset + ms.count) return ms;
  throw Error(fmt::format("rank {}: packed optimizer offset {} has no AdamW moments", comm_.rank(), packed));
}


std::vector<TensorRef> RankRuntime::optimizer_refs() {
  std::vector<TensorRef> refs;
  const Model& model = backend_->model();
  if (!layout_.sharded && moments_.size() == 1 && layout_.optimizer_floats() == model.num_parameters) {
    // This rank updates all of its parameters in one place: one pair of moments per tensor.
    for (const char* moment : {"m", "v"}) {
      float* base = moment[0] == 'm' ? moments_.front().m : moments_.front().v;
      for (const TensorView& view : model.views)
        refs.push_back({fmt::format("adamw.{}.{}", moment, view.name), view.shape, base + view.offset});
    }
    return refs;
  }
  for (const MomentSegment& ms : moments_) {
    const std::string suffix = moments_.size() == 1 ? "" : fmt::format("@{}", ms.packed_offset);
    refs.push_back({"adamw.m" + suffix, {ms.count}, ms.m});
    refs.push_back({"adamw.v" + suffix, {ms.count}, ms.v});
  }
  return refs;
}


// Consecutive tensors with the same weight decay, clipped to the optimizer ranges: one update
// each (a launch per span on a GPU, not per tensor).
std::vector<RankRuntime::UpdateSpan> RankRuntime::update_spans() const {
  std::vector<UpdateSpan> spans;
  const Model& model = backend_->model();
  int64_t packed = 0;
  for (const FlatRange& r : layout_.optimizer_ranges) {
    for (const TensorView& view : model.views) {
      const int64_t begin = std::max(r.offset, view.offset);
      const int64_t end = std::min(r.offset + r.count, view.offset + view.numel);
      if (begin >= end) continue;
      const int64_t at = packed + begin - r.offset;
      const bool joins = !spans.empty() && spans.back().decay == view.weight_decay &&
                         spans.back().offset + spans.back().count == begin &&
                         spans.back().packed + spans.back().count == at &&
                         model.segments.size() == 1 && &moments_at(spans.back().packed) == &moments_at(at);
      if (joins) {
        spans.back().count += end - begin;
      } else {
        spans.push_back({begin, end - begin, at, view.weight_decay});
      }
    }
    packed += r.count;
  }
  return spans;
}


std::vector<float> RankRuntime::full_parameters() {
  if (zero3_) return zero3_->full_parameters();
  if (layout_.sharded) {  // ZeRO 1-2 gather after every step already; this makes it explicit
    std::vector<CommHandle> handles;
    for (const GradientBucket& b : layout_.buckets)
      handles.push_back(comm_.all_gather(backend_->parameters_at(b.range.offset, b.range.count), b.piece_counts, bucket_group(b)));
    for (const CommHandle& h : handles) h.wait();
  }
  const Model& model = backend_->model();
  std::vector<float> full(static_cast<size_t>(model.num_parameters));
  for (const ParameterSegment& segment : model.segments)
    backend_->copy_to_host(full.data() + segment.offset, backend_->parameters_at(segment.offset, segment.count),
                           segment.count * static_cast<int64_t>(sizeof(float)));
  return full;
}


std::vector<TensorRef> RankRuntime::parameter_refs() {
  std::vector<TensorRef> refs;
  const Model& model = backend_->model();
  if (zero3_) refs.push_back({"zero3.pieces", {zero3_->piece_floats()}, zero3_->pieces()});
  for (const TensorView& v : model.views) {
    if (!zero3_ || model_offset_on_host(model, v.offset)) refs.push_back({v.name, v.shape, backend_->parameters_at(v.offset, v.numel)});
  }
  return refs;
}


std::vector<TensorRef> RankRuntime::host_refs(const std::vector<TensorRef>& refs,
                                              std::vector<std::vector<float>>& staging, bool download) {
  if (backend_->memory_is_host()) return refs;
  std::vector<TensorRef> host;
  staging.clear();
  staging.reserve(refs.size());
  for (const TensorRef& r : refs) {
    staging.emplace_back(static_cast<size_t>(tensor_ref_numel(r)));
    if (download) backend_->copy_to_host(staging.back().data(), r.data, tensor_ref_numel(r) * static_cast<int64_t>(sizeof(float)));
    host.push_back({r.name, r.shape, staging.back().data()});
  }
  return host;
}


std::string RankRuntime::gradient_nonfinite_name() {
  const Model& model = backend_->model();
  std::vector<float> host;
  for (const TensorView& view : model.views) {
    for (const FlatRange& piece : gradient_pieces({view.offset, view.numel})) {
      const float* grads = gradients_at(piece.offset, piece.count);
      if (!backend_->memory_is_host()) {
        host.resize(static_cast<size_t>(piece.count));
        backend_->copy_to_host(host.data(), grads, piece.count * static_cast<int64_t>(sizeof(float)));
        grads = host.data();
      }
      if (!floats_finite(grads, piece.count)) return view.name + "'s gradient";
    }
  }
  return "";
}


void RankRuntime::state_check_finite(const std::string& action, const std::string& file, bool with_moments) {
  std::vector<std::vector<float>> parameter_staging, optimizer_staging;
  std::string found = first_nonfinite(host_refs(parameter_refs(), parameter_staging, true));
  if (found.empty() && with_moments) found = first_nonfinite(host_refs(optimizer_refs(), optimizer_staging, true));
  const RankFinding first = dist_first_finding(control_, found);
  if (first.rank < 0) return;
  const std::string where = control_.world_size() > 1 ? fmt::format(" on rank {}", first.rank) : "";
  throw NonFiniteError(
      fmt::format("refusing to {}: {}{} holds NaN or Inf", action, first.text, where), {file, first.text},
      "nothing was written; lower the learning rate (--lr) and train again from the last good checkpoint");
}


CheckpointFileRecords RankRuntime::checkpoint_save_to(const std::string& dir, const CheckpointState& state,
                                                      const CheckpointSaveOptions& options) {
  state_check_finite("save a checkpoint", dir, true);
  std::vector<std::vector<float>> parameter_staging, optimizer_staging;
  const std::vector<TensorRef> parameters = host_refs(parameter_refs(), parameter_staging, true);
  const std::vector<TensorRef> moments = host_refs(optimizer_refs(), optimizer_staging, true);
  const StoredLayout stored{&backend_->model(), layout_.optimizer_ranges,
                            zero3_ ? zero3_->piece_ranges() : std::vector<FlatRange>{}};
  CheckpointState with_layout = state;
  with_layout.global_layout = global_layout_json(global_layout_of(parameters, stored), global_layout_of(moments, stored));
  return checkpoint_save(dir, parameters, moments, with_layout, options);
}


CheckpointState RankRuntime::checkpoint_load_from(const std::string& dir, const std::string& fingerprint) {
  const std::vector<TensorRef> parameters = parameter_refs(), moments = optimizer_refs();
  std::vector<std::vector<float>> parameter_staging, optimizer_staging;
  const std::vector<TensorRef> host_parameters = host_refs(parameters, parameter_staging, false);
  const std::vector<TensorRef> host_moments = host_refs(moments, optimizer_staging, false);
  CheckpointState state = checkpoint_load(dir, fingerprint, host_parameters, host_moments);
  checkpoint_check_finite(dir, host_parameters, host_moments);
  checkpoint_loaded(parameters, host_parameters, moments, host_moments, state.step);
  return state;
}

void RankRuntime::checkpoint_reshard_from(const std::vector<std::string>& rank_dirs,
                                          const std::function<void(int)>& verify, int64_t step) {
  const std::vector<TensorRef> parameters = parameter_refs(), moments = optimizer_refs();
  std::vector<std::vector<float>> parameter_staging, optimizer_staging;
  const std::vector<TensorRef> host_parameters = host_refs(parameters, parameter_staging, false);
  const std::vector<TensorRef> host_moments = host_refs(moments, optimizer_staging, false);
  const StoredLayout stored{&backend_->model(), layout_.optimizer_ranges,
                            zero3_ ? zero3_->piece_ranges() : std::vector<FlatRange>{}};
  ReshardSources sources(rank_dirs, verify);
  const GlobalLayout parameter_layout = global_layout_of(host_parameters, stored);
  const GlobalLayout moment_layout = global_layout_of(host_moments, stored);
  // The runs one writer alone holds first, then those with copies, read where files are open.
  for (const bool first : {true, false})
    for (const auto& [refs, layout] : {std::pair{&host_parameters, &parameter_layout}, std::pair{&host_moments, &moment_layout}})
      for (const TensorRef& ref : *refs)
        for (const GlobalRun& run : layout->at(ref.name))
          if (sources.one_writer(run) == first) sources.read(run, ref.data + run.local_offset);
  const std::string where = rank_dirs.empty() ? "" : rank_dirs.front();
  checkpoint_check_finite(where, host_parameters, host_moments);
  checkpoint_loaded(parameters, host_parameters, moments, host_moments, step);
}

void RankRuntime::checkpoint_loaded(const std::vector<TensorRef>& parameters, const std::vector<TensorRef>& host_parameters,
                                    const std::vector<TensorRef>& moments, const std::vector<TensorRef>& host_moments,
                                    int64_t step) {
  if (!backend_->memory_is_host()) {
    for (size_t i = 0; i < parameters.size(); ++i)
      backend_->copy_from_host(parameters[i].data, host_parameters[i].data, tensor_ref_numel(parameters[i]) * static_cast<int64_t>(sizeof(float)));
    for (size_t i = 0; i < moments.size(); ++i)
      backend_->copy_from_host(moments[i].data, host_moments[i].data, tensor_ref_numel(moments[i]) * static_cast<int64_t>(sizeof(float)));
  }
  backend_->parameters_changed();
  optimizer_steps_ = step;
}


}  // namespace alloy
