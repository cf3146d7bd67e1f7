// Global runs of a rank's stored tensors, and the reads that fill another layout's tensors from them.
#include "runtime/parallel/reshard.hpp"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/io/checkpoint.hpp"
#include "runtime/shard.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace {

bool starts_with(const std::string& text, const char* prefix) { return text.rfind(prefix, 0) == 0; }

// The flat ranges at packed positions [packed, packed + count) of `ranges` packed in order.
std::vector<FlatRange> unpacked(const std::vector<FlatRange>& ranges, int64_t packed, int64_t count) {
  std::vector<FlatRange> out;
  int64_t at = 0;
  for (const FlatRange& r : ranges) {
    const int64_t begin = std::max(packed, at);
    const int64_t end = std::min(packed + count, at + r.count);
    if (begin < end) out.push_back({r.offset + begin - at, end - begin});
    at += r.count;
  }
  return out;
}

// The flat ranges a stored tensor holds, in its element order; `prefix` gets its global names'.
std::vector<FlatRange> stored_ranges(const TensorRef& ref, const StoredLayout& stored, std::string* prefix) {
  std::string name = ref.name;
  prefix->clear();
  for (const char* moment : {"adamw.m", "adamw.v"}) {
    if (!starts_with(name, moment)) continue;
    *prefix = std::string(moment) + "/";
    const std::string rest = name.substr(std::strlen(moment));
    if (rest.empty()) return unpacked(stored.optimizer_ranges, 0, tensor_ref_numel(ref));
    if (rest[0] == '@') return unpacked(stored.optimizer_ranges, std::stoll(rest.substr(1)), tensor_ref_numel(ref));
    name = rest.substr(1);  // "adamw.m.<view>"
    break;
  }
  if (name == "zero3.pieces") return stored.zero3_pieces;
  const TensorView& view = model_view(*stored.model, name);
  return {{view.offset, view.numel}};
}

// Appends `run`, joined to the last one when both continue each other.
void run_append(std::vector<GlobalRun>& runs, GlobalRun run) {
  if (!runs.empty()) {
    GlobalRun& last = runs.back();
    if (last.tensor == run.tensor && last.full_offset + last.count == run.full_offset &&
        last.local_offset + last.count == run.local_offset) {
      last.count += run.count;
      return;
    }
  }
  runs.push_back(std::move(run));
}

}  // namespace

GlobalLayout global_layout_of(const std::vector<TensorRef>& refs, const StoredLayout& stored) {
  const Model& model = *stored.model;
  const std::vector<ShardedTensor> slices = shard_tensors(model.spec, model.shard);  // in view order
  GlobalLayout out;
  for (const TensorRef& ref : refs) {
    std::string prefix;
    std::vector<GlobalRun>& runs = out[ref.name];
    int64_t local = 0;  // the stored tensor's element where the current flat range starts
    for (const FlatRange& range : stored_ranges(ref, stored, &prefix)) {
      for (size_t k = 0; k < model.views.size(); ++k) {
        const TensorView& view = model.views[k];
        const int64_t begin = std::max(range.offset, view.offset) - view.offset;  // the view's own elements
        const int64_t end = std::min(range.offset + range.count, view.offset + view.numel) - view.offset;
        if (begin >= end) continue;
        int64_t slice_at = 0;
        for (const ShardSegment& slice : slices[k].segments) {
          const int64_t a = std::max(begin, slice_at);
          const int64_t b = std::min(end, slice_at + slice.count);
          if (a < b) run_append(runs, {prefix + view.name, slice.full_offset + (a - slice_at), b - a, local + (a - begin)});
          slice_at += slice.count;
        }
        local += end - begin;
      }
    }
    if (local != tensor_ref_numel(ref))
      throw Error(fmt::format("stored tensor {} has {} elements, its layout covers {}", ref.name, tensor_ref_numel(ref), local));
  }
  return out;
}

std::string global_layout_json(const GlobalLayout& model, const GlobalLayout& optimizer) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [part, layout] : {std::pair{"model", &model}, std::pair{"optimizer", &optimizer}}) {
    nlohmann::json& entries = out[part] = nlohmann::json::object();
    for (const auto& [name, runs] : *layout) {
      nlohmann::json& list = entries[name] = nlohmann::json::array();
      // Runs of equal length that follow each other in the stored tensor at a fixed distance in
      // the full one (a column-split matrix's rows) are written once with that stride and their
      // number: [tensor, full offset, count, local offset, stride, repeat].
      for (size_t k = 0; k < runs.size();) {
        const GlobalRun& r = runs[k];
        size_t end = k + 1;
        const int64_t stride = end < runs.size() ? runs[end].full_offset - r.full_offset : 0;
        while (end < runs.size() && runs[end].tensor == r.tensor && runs[end].count == r.count &&
               runs[end].local_offset == r.local_offset + static_cast<int64_t>(end - k) * r.count &&
               runs[end].full_offset == r.full_offset + static_cast<int64_t>(end - k) * stride)
          ++end;
        if (end - k > 1) {
          list.push_back({r.tensor, r.full_offset, r.count, r.local_offset, stride, end - k});
        } else {
          list.push_back({r.tensor, r.full_offset, r.count, r.local_offset});
        }
        k = end;
      }
    }
  }
  return out.dump();
}

ReshardSources::ReshardSources(const std::vector<std::string>& rank_dirs, std::function<void(int)> verify)
    : verified_(rank_dirs.size(), false), verify_(std::move(verify)) {
  if (!rank_dirs.empty()) checkpoint_ = rank_dirs.front().substr(0, rank_dirs.front().find_last_of('/'));
  for (size_t r = 0; r < rank_dirs.size(); ++r) {
    const std::string& dir = rank_dirs[r];
    const CheckpointState state = checkpoint_read_state(dir);
    if (state.global_layout.empty())
      throw Error("this checkpoint does not say where its tensors lie in the full model, so it cannot be loaded "
                  "under another layout",
                  {dir + "/" + kCheckpointManifest, "global_layout"},
                  "resume it under the plan that wrote it (its plan.json), then save again");
    for (const char* part : {kCheckpointModelFile, kCheckpointOptimizerFile})
      add(static_cast<int>(r), dir, state.global_layout, part);
  }
  for (auto& [tensor, sources] : by_tensor_) {
    std::sort(sources.begin(), sources.end(), [](const Source& a, const Source& b) { return a.full_offset < b.full_offset; });
    int64_t& longest = longest_[tensor];
    for (const Source& source : sources) longest = std::max(longest, source.count);
  }
}

void ReshardSources::add(int writer, const std::string& dir, const std::string& layout_json, const char* part) {
  const std::string where = dir + "/" + kCheckpointManifest;
  File file;
  file.writer = writer;
  file.path = dir + "/" + part;
  const int index = static_cast<int>(files_.size());
  try {
    const nlohmann::json layout = nlohmann::json::parse(layout_json).at(part == kCheckpointModelFile ? "model" : "optimizer");
    for (const auto& [name, runs] : layout.items()) {
      const int entry = static_cast<int>(file.entry_names.size());
      file.entry_names.push_back(name);
      for (const nlohmann::json& r : runs) {
        const int64_t stride = r.size() > 4 ? r.at(4).get<int64_t>() : 0;
        const int64_t repeat = r.size() > 4 ? r.at(5).get<int64_t>() : 1;
        const int64_t count = r.at(2).get<int64_t>();
        std::vector<Source>& sources = by_tensor_[r.at(0).get<std::string>()];
        for (int64_t k = 0; k < repeat; ++k)
          sources.push_back({r.at(1).get<int64_t>() + k * stride, count, r.at(3).get<int64_t>() + k * count, index, entry});
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("malformed global_layout: {}", e.what()), {where, "global_layout"},
                "the checkpoint is damaged: use an older one");
  }
  files_.push_back(std::move(file));
}

bool ReshardSources::one_writer(const GlobalRun& run) const {
  const auto found = by_tensor_.find(run.tensor);
  if (found == by_tensor_.end()) return true;
  const std::vector<Source>& sources = found->second;
  const int64_t longest = longest_.at(run.tensor);
  // The sources starting before the run's end, back to where none could reach into it.
  auto s = std::lower_bound(sources.begin(), sources.end(), run.full_offset + run.count,
                            [](const Source& source, int64_t value) { return source.full_offset < value; });
  int writer = -1;
  while (s != sources.begin()) {
    --s;
    if (s->full_offset + longest <= run.full_offset) break;
    if (s->full_offset + s->count <= run.full_offset) continue;
    const int w = files_[static_cast<size_t>(s->file)].writer;
    if (writer >= 0 && w != writer) return false;
    writer = w;
  }
  return true;
}

const SafetensorsEntry& ReshardSources::entry_of(const Source& source) {
  File& file = files_[static_cast<size_t>(source.file)];
  if (!file.open) {
    if (!verified_[static_cast<size_t>(file.writer)]) {
      if (verify_) verify_(file.writer);
      verified_[static_cast<size_t>(file.writer)] = true;
    }
    file.open = std::make_unique<SafetensorsFile>(safetensors_open(file.path));
    for (const std::string& name : file.entry_names) {
      const SafetensorsEntry* entry = file.open->entry_find(name);
      if (entry == nullptr)
        throw Error(fmt::format("the layout lists {}, which {} does not hold", name, file.path),
                    {file.path, name}, "the checkpoint is damaged: use an older one");
      file.entries.push_back(entry);
    }
  }
  return *file.entries[static_cast<size_t>(source.entry)];
}

void ReshardSources::read(const GlobalRun& run, float* out) {
  const auto found = by_tensor_.find(run.tensor);
  const auto missing = [&](int64_t from) {
    return Error(fmt::format("no rank of the checkpoint stored {} from element {} on (this layout needs [{}, {}))",
                             run.tensor, from, run.full_offset, run.full_offset + run.count),
                 {checkpoint_, run.tensor},
                 "the checkpoint is of another model or damaged: resume with the model it was written for");
  };
  if (found == by_tensor_.end()) throw missing(run.full_offset);
  const std::vector<Source>& sources = found->second;
  int64_t at = run.full_offset;
  const int64_t end = run.full_offset + run.count;
  while (at < end) {
    // The sources starting at or before `at`, latest first: one of them covers it, or none does.
    auto next = std::upper_bound(sources.begin(), sources.end(), at,
                                 [](int64_t value, const Source& s) { return value < s.full_offset; });
    // Of copies of the same elements (a tied table on two stages, replicas' whole tensors), one in
    // a file already open, so that no other writer's files are read for them.
    const Source* cover = nullptr;
    for (auto s = next; s != sources.begin();) {
      --s;
      if (s->full_offset + s->count <= at) {
        if (cover != nullptr) break;
        continue;
      }
      if (cover == nullptr || files_[static_cast<size_t>(s->file)].open) cover = &*s;
      if (files_[static_cast<size_t>(cover->file)].open) break;
    }
    if (cover == nullptr) throw missing(at);
    const int64_t n = std::min(end, cover->full_offset + cover->count) - at;
    const SafetensorsEntry& entry = entry_of(*cover);
    files_[static_cast<size_t>(cover->file)].open->entry_copy_range(entry, cover->local_offset + (at - cover->full_offset), n,
                                                                    out + (at - run.full_offset));
    at += n;
  }
}

}  // namespace alloy
