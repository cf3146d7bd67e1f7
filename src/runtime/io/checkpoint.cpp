// Atomic, checksummed training checkpoints (see checkpoint.hpp).
#include "runtime/io/checkpoint.hpp"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "spec/error.hpp"

namespace alloy {

namespace fs = std::filesystem;

namespace {

constexpr char kFormatName[] = "alloy-checkpoint";
constexpr int kFormatVersion = 1;

// "ckpt/" and "ckpt" name the same directory.
fs::path dir_normalize(const std::string& dir) {
  fs::path path = fs::path(dir).lexically_normal();
  return path.has_filename() ? path : path.parent_path();
}

fs::path sibling(const fs::path& dir, const std::string& suffix) {
  return dir.parent_path() / (dir.filename().string() + suffix);
}

// The directory to load from: `dir`, or `<dir>.prev` when a save was cut between its renames.
fs::path dir_resolve(const std::string& dir) {
  fs::path path = dir_normalize(dir);
  std::error_code ec;
  if (fs::exists(path, ec)) return path;
  fs::path prev = sibling(path, ".prev");
  if (fs::exists(prev / kCheckpointManifest, ec)) return prev;
  throw Error("checkpoint directory not found", io_where(dir), "check the path given to --resume");
}

// Writes one safetensors file into `dir`, charging its bytes to the fault budget.
CheckpointFileRecord file_save(const fs::path& path, std::span<const TensorRef> tensors, const SafetensorsMetadata& metadata,
                     std::int64_t& fault_budget) {
  FileWriter writer(path.string(), fault_budget);
  safetensors_write(writer, tensors, metadata);
  writer.close_synced();
  if (fault_budget >= 0) {
    fault_budget -= std::min<std::int64_t>(fault_budget, static_cast<std::int64_t>(writer.written_bytes()));
  }
  return {writer.written_bytes(), writer.checksum_crc32()};
}

nlohmann::json manifest_build(const CheckpointState& state, const CheckpointFileRecord& model, const CheckpointFileRecord& optimizer) {
  auto record = [](const CheckpointFileRecord& file) {
    return nlohmann::json{{"bytes", file.size_bytes}, {"crc32", checksum_hex(file.checksum)}};
  };
  return {{"format", kFormatName},
          {"version", kFormatVersion},
          {"fingerprint", state.fingerprint},
          {"step", state.step},
          {"loader_state", state.loader_state},
          {"rng_state", state.rng_state},
          {"files", {{kCheckpointModelFile, record(model)}, {kCheckpointOptimizerFile, record(optimizer)}}},
          {"global_layout", state.global_layout.empty() ? nlohmann::json() : nlohmann::json::parse(state.global_layout)}};
}

CheckpointFileRecords dir_write_all(const fs::path& temp, std::span<const TensorRef> model,
                                    std::span<const TensorRef> optimizer, const CheckpointState& state,
                                    const CheckpointSaveOptions& options) {
  std::int64_t fault_budget = options.fault_after_bytes;
  SafetensorsMetadata metadata = {
      {"format", "pt"}, {"alloy.fingerprint", state.fingerprint}, {"alloy.step", std::to_string(state.step)}};
  CheckpointFileRecord model_record = file_save(temp / kCheckpointModelFile, model, metadata, fault_budget);
  if (options.on_model_written) options.on_model_written();
  CheckpointFileRecord optimizer_record = file_save(temp / kCheckpointOptimizerFile, optimizer, metadata, fault_budget);
  std::string text = manifest_build(state, model_record, optimizer_record).dump(2) + "\n";
  FileWriter manifest((temp / kCheckpointManifest).string(), fault_budget);
  manifest.write(text.data(), text.size());
  manifest.close_synced();
  directory_sync(temp.string());
  return {model_record, optimizer_record, {manifest.written_bytes(), manifest.checksum_crc32()}};
}

nlohmann::json manifest_read(const fs::path& dir) {
  fs::path path = dir / kCheckpointManifest;
  MappedFile mapped = mapped_file_open(path.string(), "checkpoint manifest");
  const char* text = reinterpret_cast<const char*>(mapped.bytes().data());
  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(text, text + mapped.size_bytes());
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(std::string("manifest is corrupt, not valid JSON: ") + e.what(), io_where(path.string()),
                "the checkpoint is damaged: use an older one");
  }
  if (!manifest.is_object() || manifest.value("format", "") != kFormatName) {
    throw Error("not an Alloy checkpoint manifest", io_where(path.string(), "format"),
                "pass a directory written by `alloy train`");
  }
  if (manifest.value("version", 0) != kFormatVersion) {
    throw Error("unsupported checkpoint version " + manifest["version"].dump(), io_where(path.string(), "version"),
                "load it with the Alloy version that wrote it");
  }
  return manifest;
}

// manifest[key] as T; `field` names it in errors (defaults to `key`).
template <typename T>
T manifest_field(const nlohmann::json& manifest, const fs::path& dir, const std::string& field,
                 const std::string& key = {}) {
  try {
    return manifest.at(key.empty() ? field : key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw Error("missing or malformed field", io_where((dir / kCheckpointManifest).string(), field),
                "the checkpoint is damaged: use an older one");
  }
}

// Checks that `name` in `dir` exists and has the size and checksum recorded in the manifest.
void file_verify(const fs::path& dir, const nlohmann::json& manifest, const std::string& name) {
  std::string path = (dir / name).string();
  std::string field = "files." + name;
  auto record = manifest_field<nlohmann::json>(manifest, dir, "files");
  if (!record.contains(name)) record[name] = nullptr;
  auto size_bytes = manifest_field<std::uint64_t>(record[name], dir, field + ".bytes", "bytes");
  auto checksum = manifest_field<std::string>(record[name], dir, field + ".crc32", "crc32");
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    throw Error("checkpoint file missing", io_where(path),
                "the checkpoint is incomplete: copy the whole directory, or use an older one");
  }
  MappedFile mapped = mapped_file_open(path, "checkpoint file");
  if (mapped.size_bytes() != size_bytes) {
    throw Error("file is corrupt: it has " + std::to_string(mapped.size_bytes()) + " bytes, the manifest recorded " +
                    std::to_string(size_bytes),
                io_where(path, "bytes"), "the checkpoint is damaged: use an older one");
  }
  std::string actual = checksum_hex(crc32_update_parallel(0, mapped.bytes()));
  if (actual != checksum) {
    throw Error("file is corrupt: checksum " + actual + " differs from the recorded " + checksum,
                io_where(path, "crc32"), "the checkpoint is damaged: use an older one");
  }
}

CheckpointState state_from_manifest(const nlohmann::json& manifest, const fs::path& path) {
  CheckpointState state;
  state.step = manifest_field<std::int64_t>(manifest, path, "step");
  state.fingerprint = manifest_field<std::string>(manifest, path, "fingerprint");
  state.loader_state = manifest_field<std::vector<std::uint64_t>>(manifest, path, "loader_state");
  state.rng_state = manifest_field<std::vector<std::uint64_t>>(manifest, path, "rng_state");
  manifest_field<nlohmann::json::object_t>(manifest, path, "files");
  if (manifest.contains("global_layout") && !manifest["global_layout"].is_null())
    state.global_layout = manifest["global_layout"].dump();
  return state;
}

}  // namespace

CheckpointFileRecords checkpoint_save(const std::string& dir, std::span<const TensorRef> model,
                                      std::span<const TensorRef> optimizer, const CheckpointState& state,
                                      const CheckpointSaveOptions& options) {
  fs::path target = dir_normalize(dir);
  std::error_code ec;
  if (fs::exists(target, ec) &&
      !(fs::is_directory(target, ec) && (fs::is_empty(target, ec) || fs::exists(target / kCheckpointManifest, ec)))) {
    throw Error("exists and is not an Alloy checkpoint: refusing to replace it", io_where(dir),
                "choose a new checkpoint directory");
  }
  fs::path temp = sibling(target, ".tmp");
  fs::path prev = sibling(target, ".prev");
  CheckpointFileRecords records;
  try {
    fs::remove_all(temp);
    fs::create_directories(temp);
    records = dir_write_all(temp, model, optimizer, state, options);
    // A stale `prev` goes only when `target` is complete; after a crash between the renames
    // `prev` is the one good copy and stays until the new checkpoint is in place.
    if (fs::exists(target)) {
      fs::remove_all(prev);
      fs::rename(target, prev);
    }
    fs::rename(temp, target);
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(temp, ec);
    throw Error(std::string("cannot write checkpoint: ") + e.what(), io_where(dir),
                "check free disk space and write permission of the parent directory");
  } catch (...) {
    fs::remove_all(temp, ec);
    throw;
  }
  directory_sync(target.parent_path().string());
  fs::remove_all(prev, ec);
  return records;
}

CheckpointState checkpoint_read_state(const std::string& dir) {
  fs::path path = dir_resolve(dir);
  return state_from_manifest(manifest_read(path), path);
}

CheckpointState checkpoint_load(const std::string& dir, const std::string& expected_fingerprint,
                                std::span<const TensorRef> model, std::span<const TensorRef> optimizer) {
  fs::path path = dir_resolve(dir);
  nlohmann::json manifest = manifest_read(path);
  CheckpointState state = state_from_manifest(manifest, path);
  if (state.fingerprint != expected_fingerprint) {
    throw Error("the checkpoint is for model \"" + state.fingerprint + "\", but this run's model is \"" +
                    expected_fingerprint + "\"",
                io_where((path / kCheckpointManifest).string(), "fingerprint"),
                "resume with the model config the checkpoint was written with, or start afresh");
  }
  file_verify(path, manifest, kCheckpointModelFile);
  safetensors_read_into(safetensors_open((path / kCheckpointModelFile).string()), model);
  if (!optimizer.empty()) {
    file_verify(path, manifest, kCheckpointOptimizerFile);
    safetensors_read_into(safetensors_open((path / kCheckpointOptimizerFile).string()), optimizer);
  }
  return state;
}

}  // namespace alloy
