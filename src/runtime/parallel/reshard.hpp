// Checkpoints across layouts. Every tensor a rank stores (a parameter's tensor-parallel slice,
// ZeRO 3's packed pieces, AdamW moments packed like the optimizer's ranges) is described as runs
// of the model's full tensors: a global name and element offset. A rank of any other plan then
// finds the values it needs in the files of the ranks that wrote them and reads only those
// slices (the idea of PyTorch's distributed checkpoint, over Alloy's per-rank files).
#pragma once

#include <cstdint>
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
// count, local offset] arrays.
std::string global_layout_json(const GlobalLayout& model, const GlobalLayout& optimizer);

// The files of a checkpoint's ranks, opened with their layouts.
class ReshardSources {
 public:
  // rank_dirs: each writing rank's folder of the step, its files already checked against the
  // committed manifest (checkpoint_manifest_check_files).
  explicit ReshardSources(const std::vector<std::string>& rank_dirs);
  // Fills out[0, run.count) with full tensor run.tensor's elements [run.full_offset, + count).
  // Throws alloy::Error naming the tensor and the elements no rank stored.
  void read(const GlobalRun& run, float* out) const;

 private:
  struct Source {
    int64_t full_offset = 0;
    int64_t count = 0;
    int64_t local_offset = 0;
    const SafetensorsFile* file = nullptr;
    const SafetensorsEntry* entry = nullptr;
  };
  void add(const std::string& dir, const SafetensorsFile& file, const std::string& layout_json, const char* part);

  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::vector<Source>> by_tensor_;  // sorted by full_offset
  std::string checkpoint_;  // the step folder, for errors
};

}  // namespace alloy
