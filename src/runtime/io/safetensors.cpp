// Reading and writing float32 safetensors files (see safetensors.hpp).
#include "runtime/io/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <set>

#include "runtime/bf16.hpp"
#include "spec/error.hpp"

namespace alloy {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace {

constexpr char kMetadataKey[] = "__metadata__";
const char kFormatHint[] = "the file is not a valid safetensors file: re-export it, or check that it was copied whole";

[[noreturn]] void fail(const std::string& path, const std::string& field, const std::string& what,
                       const std::string& hint = kFormatHint) {
  throw Error(what, io_where(path, field), hint);
}

std::vector<std::int64_t> shape_parse(const std::string& path, const std::string& field, const nlohmann::json& value) {
  if (!value.is_array()) fail(path, field, "shape must be an array of non-negative integers");
  std::vector<std::int64_t> shape;
  for (const auto& dim : value) {
    if (!dim.is_number_integer() || dim.get<std::int64_t>() < 0) {
      fail(path, field, "shape must be an array of non-negative integers, found " + dim.dump());
    }
    shape.push_back(dim.get<std::int64_t>());
  }
  return shape;
}

SafetensorsEntry entry_parse(const std::string& path, const std::string& name, const nlohmann::json& value,
                             std::uint64_t data_bytes) {
  std::string field = "\"" + name + "\"";
  if (!value.is_object()) fail(path, field, "tensor entry must be an object");
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(key)) fail(path, field + "." + key, std::string("missing ") + key);
  }
  const auto& dtype = value["dtype"];
  SafetensorsEntry entry;
  entry.name = name;
  if (dtype.is_string() && dtype.get<std::string>() == "BF16") entry.dtype = SafetensorsDtype::SafetensorsDtype_bf16;
  else if (dtype.is_string() && dtype.get<std::string>() == "F16") entry.dtype = SafetensorsDtype::SafetensorsDtype_f16;
  else if (!dtype.is_string() || dtype.get<std::string>() != "F32")
    fail(path, field + ".dtype", "dtype " + dtype.dump() + " is not supported: Alloy reads F32, BF16 and F16",
         "convert the tensors to float32 before loading them into Alloy");
  entry.shape = shape_parse(path, field + ".shape", value["shape"]);
  const auto& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    fail(path, field + ".data_offsets", "data_offsets must be [begin, end], found " + offsets.dump());
  }
  entry.begin_bytes = offsets[0].get<std::uint64_t>();
  entry.end_bytes = offsets[1].get<std::uint64_t>();
  if (entry.begin_bytes > entry.end_bytes || entry.end_bytes > data_bytes) {
    fail(path, field + ".data_offsets",
         "data_offsets " + offsets.dump() + " lie outside the " + std::to_string(data_bytes) + " bytes of tensor data");
  }
  std::uint64_t numel = 1;
  for (std::int64_t dim : entry.shape) numel *= static_cast<std::uint64_t>(dim);
  const std::uint64_t element = safetensors_element_bytes(entry.dtype);
  if (numel * element != entry.end_bytes - entry.begin_bytes) {
    fail(path, field + ".shape",
         "shape " + shape_text(entry.shape) + " holds " + std::to_string(numel) + " elements (" +
             std::to_string(numel * element) + " bytes) but data_offsets span " +
             std::to_string(entry.end_bytes - entry.begin_bytes) + " bytes");
  }
  return entry;
}

// Tensors must tile the data exactly: sorted by offset, each begins where the previous ended.
void entries_check_tiling(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                          std::uint64_t data_bytes) {
  std::uint64_t expected_begin = 0;
  for (const auto& entry : entries) {
    if (entry.begin_bytes != expected_begin) {
      fail(path, "\"" + entry.name + "\".data_offsets",
           std::string(entry.begin_bytes < expected_begin ? "overlaps the previous tensor"
                                                          : "leaves a gap after the previous tensor") +
               ": begins at byte " + std::to_string(entry.begin_bytes) + ", expected " +
               std::to_string(expected_begin));
    }
    expected_begin = entry.end_bytes;
  }
  if (expected_begin != data_bytes) {
    fail(path, "data_offsets",
         std::to_string(data_bytes - expected_begin) + " bytes after the last tensor belong to no tensor");
  }
}

}  // namespace

std::int64_t tensor_ref_numel(const TensorRef& view) {
  std::int64_t numel = 1;
  for (std::int64_t dim : view.shape) numel *= dim;
  return numel;
}

std::string shape_text(std::span<const std::int64_t> shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

const SafetensorsEntry* SafetensorsFile::entry_find(const std::string& name) const {
  for (const auto& entry : entries_) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

std::int64_t safetensors_entry_numel(const SafetensorsEntry& entry) {
  return static_cast<std::int64_t>((entry.end_bytes - entry.begin_bytes) / safetensors_element_bytes(entry.dtype));
}

void SafetensorsFile::entry_copy(const SafetensorsEntry& entry, float* out) const {
  entry_copy_range(entry, 0, safetensors_entry_numel(entry), out);
}

void SafetensorsFile::entry_copy_range(const SafetensorsEntry& entry, std::int64_t first, std::int64_t count,
                                       float* out) const {
  const std::int64_t numel = safetensors_entry_numel(entry);
  if (first < 0 || count < 0 || first + count > numel)
    throw Error(fmt::format("floats [{}, {}) of tensor {} which has {}", first, first + count, entry.name, numel),
                {path(), entry.name}, "the checkpoint's layout does not match its tensors: it is damaged");
  if (count == 0) return;
  const std::uint64_t element = safetensors_element_bytes(entry.dtype);
  const std::byte* from = mapped_.bytes().data() + data_begin_bytes_ + entry.begin_bytes + static_cast<std::uint64_t>(first) * element;
  if (entry.dtype == SafetensorsDtype::SafetensorsDtype_f32) {
    std::memcpy(out, from, static_cast<std::size_t>(count) * sizeof(float));
    return;
  }
  for (std::int64_t i = 0; i < count; ++i) {
    std::uint16_t half = 0;
    std::memcpy(&half, from + 2 * i, 2);
    out[i] = entry.dtype == SafetensorsDtype::SafetensorsDtype_bf16 ? bf16_to_float(half) : float_from_f16(half);
  }
}

SafetensorsFile safetensors_open(const std::string& path) {
  SafetensorsFile file;
  file.mapped_ = mapped_file_open(path, "safetensors file");
  auto bytes = file.mapped_.bytes();
  if (bytes.size() < 8) {
    fail(path, "header length",
         "file has " + std::to_string(bytes.size()) + " bytes, too short for the 8-byte header length");
  }
  std::uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, bytes.data(), 8);
  if (header_bytes > bytes.size() - 8) {
    fail(path, "header length",
         "header length " + std::to_string(header_bytes) + " runs past the end of the file (" +
             std::to_string(bytes.size()) + " bytes)");
  }
  file.data_begin_bytes_ = 8 + header_bytes;
  std::uint64_t data_bytes = bytes.size() - file.data_begin_bytes_;
  const char* text = reinterpret_cast<const char*>(bytes.data() + 8);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text, text + header_bytes);
  } catch (const nlohmann::json::parse_error& e) {
    fail(path, "header", std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) fail(path, "header", "header must be a JSON object");
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      if (!value.is_object()) fail(path, kMetadataKey, "__metadata__ must be an object");
      for (const auto& [key, item] : value.items()) {
        if (!item.is_string()) {
          fail(path, std::string(kMetadataKey) + "." + key, "metadata values must be strings");
        }
        file.metadata_[key] = item.get<std::string>();
      }
      continue;
    }
    file.entries_.push_back(entry_parse(path, name, value, data_bytes));
  }
  std::sort(file.entries_.begin(), file.entries_.end(), [](const auto& a, const auto& b) {
    return a.begin_bytes != b.begin_bytes ? a.begin_bytes < b.begin_bytes : a.end_bytes < b.end_bytes;
  });
  entries_check_tiling(path, file.entries_, data_bytes);
  return file;
}

void safetensors_read_into(const SafetensorsFile& file, std::span<const TensorRef> views) {
  std::set<std::string> wanted;
  for (const auto& view : views) {
    wanted.insert(view.name);
    const SafetensorsEntry* entry = file.entry_find(view.name);
    if (entry == nullptr) {
      throw Error("tensor missing from the file", io_where(file.path(), view.name),
                  "the file was written for a different model layout");
    }
    if (entry->shape != view.shape) {
      throw Error(
          "shape mismatch: the file has " + shape_text(entry->shape) + ", the model expects " + shape_text(view.shape),
          io_where(file.path(), view.name), "the file was written for a model with a different configuration");
    }
  }
  for (const auto& entry : file.entries()) {
    if (!wanted.contains(entry.name)) {
      throw Error("unexpected tensor: the file has it, the model has no tensor of that name",
                  io_where(file.path(), entry.name), "the file was written for a different model layout");
    }
  }
  for (const auto& view : views) file.entry_copy(*file.entry_find(view.name), view.data);
}

void safetensors_write(FileWriter& out, std::span<const TensorRef> tensors, const SafetensorsMetadata& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::uint64_t offset = 0;
  for (const auto& view : tensors) {
    if (view.name == kMetadataKey || header.contains(view.name)) {
      throw Error("tensor name is reserved or used twice", io_where(out.path(), view.name),
                  "give every tensor a unique name");
    }
    std::uint64_t count_bytes = static_cast<std::uint64_t>(tensor_ref_numel(view)) * 4;
    header[view.name] = {{"dtype", "F32"}, {"shape", view.shape}, {"data_offsets", {offset, offset + count_bytes}}};
    offset += count_bytes;
  }
  std::string text = header.dump();
  // Pad with spaces so the tensor data starts 8-byte aligned, as the reference writer does.
  text.append((8 - text.size() % 8) % 8, ' ');
  std::uint64_t header_bytes = text.size();
  out.write(&header_bytes, 8);
  out.write(text.data(), text.size());
  for (const auto& view : tensors) {
    out.write(view.data, static_cast<std::size_t>(tensor_ref_numel(view)) * 4);
  }
}

void safetensors_save(const std::string& path, std::span<const TensorRef> tensors,
                      const SafetensorsMetadata& metadata) {
  file_write_atomic(path, [&](FileWriter& out) { safetensors_write(out, tensors, metadata); });
}

}  // namespace alloy
