// safetensors files of float32 tensors: an 8-byte little-endian header length, a JSON header
// (name -> dtype, shape, data_offsets; optional "__metadata__"), then the tensors back to back.
// Writing streams straight from the caller's buffers; reading maps the file and validates it.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "runtime/io/file_io.hpp"

namespace alloy {

// A named, non-owning view of a row-major float32 tensor in one of the caller's flat buffers.
// Writers only read through `data`; loaders fill it.
struct TensorRef {
  std::string name;
  std::vector<std::int64_t> shape;
  float* data = nullptr;
};

std::int64_t tensor_ref_numel(const TensorRef& view);
// "[2, 3]"
std::string shape_text(std::span<const std::int64_t> shape);

using SafetensorsMetadata = std::map<std::string, std::string>;

// Element types read (and turned into fp32 on copy); Alloy writes F32.
enum class SafetensorsDtype { SafetensorsDtype_f32, SafetensorsDtype_bf16, SafetensorsDtype_f16 };
inline std::uint64_t safetensors_element_bytes(SafetensorsDtype dtype) {
  return dtype == SafetensorsDtype::SafetensorsDtype_f32 ? 4 : 2;
}

struct SafetensorsEntry {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::SafetensorsDtype_f32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin_bytes = 0;  // relative to the start of the tensor data
  std::uint64_t end_bytes = 0;
};

// An open, validated safetensors file (move-only, mapped).
class SafetensorsFile {
 public:
  const std::string& path() const { return mapped_.path(); }
  // Sorted by data offset.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsMetadata& metadata() const { return metadata_; }
  // The entry called `name`, or nullptr.
  const SafetensorsEntry* entry_find(const std::string& name) const;
  // Copies the entry's elements into `out` as floats (entry numel floats).
  void entry_copy(const SafetensorsEntry& entry, float* out) const;
  // Copies floats [first, first + count) of the entry into `out` (only those pages are read).
  void entry_copy_range(const SafetensorsEntry& entry, std::int64_t first, std::int64_t count, float* out) const;
  // Every byte of the file, for checksums.
  std::span<const std::byte> bytes() const { return mapped_.bytes(); }

 private:
  friend SafetensorsFile safetensors_open(const std::string& path);
  MappedFile mapped_;
  std::uint64_t data_begin_bytes_ = 0;
  std::vector<SafetensorsEntry> entries_;
  SafetensorsMetadata metadata_;
};

// Elements of the entry.
std::int64_t safetensors_entry_numel(const SafetensorsEntry& entry);

// Opens `path` and validates it: header length beyond the file, malformed JSON, entries without
// dtype/shape/data_offsets, a dtype other than F32, BF16 or F16, offsets out of range, overlapping or leaving
// gaps, and a shape whose element count does not match the byte length are all errors.
SafetensorsFile safetensors_open(const std::string& path);

// Fills every view from the file. Errors name the file and tensor: a view with no tensor in the
// file, a tensor in the file with no view, or a shape that differs.
void safetensors_read_into(const SafetensorsFile& file, std::span<const TensorRef> views);

// Streams a safetensors file into `out`, tensors in the order given. Names must be unique and
// not "__metadata__".
void safetensors_write(FileWriter& out, std::span<const TensorRef> tensors, const SafetensorsMetadata& metadata);

// Writes `path` atomically (temporary file, fsync, rename).
void safetensors_save(const std::string& path, std::span<const TensorRef> tensors,
                      const SafetensorsMetadata& metadata);

}  // namespace alloy
