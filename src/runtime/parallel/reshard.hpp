// Checkpoints across layouts. Every tensor a rank stores (a parameter's tensor-parallel slice,
// ZeRO 3's packed pieces, AdamW moments packed like the optimizer's ranges) is described as runs
// of the model's full tensors: a global name and element offset. A rank of any other plan then
// finds the values it needs in the files of the ranks that wrote them and reads only those
// slices (the idea of PyTorch's distributed checkpoint, over Alloy's per-rank files).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/io/safetensors.hpp"
#include "runtime/model.hpp"

namespace alloy {

// A stored tensor's elements [local_offset, local_offset + count) are the full tensor `tensor`'s
// elements [full_offset, full_offset + count) (row-major). Global names: a parameter's
// ("layers.0.attn.qkv.weight"), or a moment of it ("adamw.m/layers.0.attn.qkv.weight").
struct GlobalRun {
  std::string tensor;
  int64_t full_offset = 0;
  int64_t count = 0;
  int64_t local_offset = 0;
};

// Stored tensor name -> its runs, in its element order.
using GlobalLayout = std::map<std::string, std::vector<GlobalRun>>;

// What a rank's stored tensors are made of: its model's views (the shard), the flat ranges its
// optimizer updates (packed in order: the packed moments) and ZeRO 3's device pieces (packed in
// order: "zero3.pieces").
struct StoredLayout {
  const Model* model = nullptr;
  std::vector<FlatRange> optimizer_ranges;
  std::vector<FlatRange> zero3_pieces;
};

// The runs of each of `refs`, named as RankRuntime names what it stores: a view's name,
// "zero3.pieces", "adamw.m.<view>" per tensor, "adamw.m" or "adamw.m@<packed offset>" packed.
GlobalLayout global_layout_of(const std::vector<TensorRef>& refs, const StoredLayout& stored);

// {"model": {...}, "optimizer": {...}}: each stored name with its runs as [tensor, full offset,
// count, local offset] arrays, or [..., stride, repeat] for `repeat` runs whose full offsets step
// by `stride` while their local ones follow each other (a column-split matrix's rows).
std::string global_layout_json(const GlobalLayout& model, const GlobalLayout& optimizer);

// The files of a checkpoint's ranks with their layouts. A writer's files are checked and opened
// when a slice is first read from them, so a rank touches only the writers holding what it needs.
class ReshardSources {
 public:
  // rank_dirs: each writing rank's folder of the step. verify(r) checks writer r's files (against
  // the committed manifest: checkpoint_manifest_check_files) before the first read from them.
  ReshardSources(const std::vector<std::string>& rank_dirs, std::function<void(int)> verify);
  // Fills out[0, run.count) with full tensor run.tensor's elements [run.full_offset, + count).
  // Throws alloy::Error naming the tensor and the elements no rank stored.
  void read(const GlobalRun& run, float* out);
  // Whether one writer alone stored the run's elements: reading such runs first opens the
  // writers a rank cannot do without, and copies elsewhere are then read from those.
  bool one_writer(const GlobalRun& run) const;

 private:
  struct Source {
    int64_t full_offset = 0;
    int64_t count = 0;
    int64_t local_offset = 0;
    int file = 0;   // into files_
    int entry = 0;  // into that file's entry names
  };
  struct File {
    int writer = 0;
    std::string path;
    std::vector<std::string> entry_names;
    std::unique_ptr<SafetensorsFile> open;  // once read from
    std::vector<const SafetensorsEntry*> entries;
  };
  void add(int writer, const std::string& dir, const std::string& layout_json, const char* part);
  // The entry of `source`, its writer checked and its file opened on first use.
  const SafetensorsEntry& entry_of(const Source& source);

  std::vector<File> files_;
  std::vector<bool> verified_;  // per writer
  std::function<void(int)> verify_;
  std::map<std::string, std::vector<Source>> by_tensor_;  // sorted by full_offset
  std::map<std::string, int64_t> longest_;                // each tensor's longest source
  std::string checkpoint_;  // the step folder, for errors
};

}  // namespace alloy
