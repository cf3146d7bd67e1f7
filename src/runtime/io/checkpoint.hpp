// One rank's training checkpoint: a directory holding model.safetensors (weights by name,
// readable by PyTorch), optimizer.safetensors (optimizer state tensors) and checkpoint.json
// (step, data loader and RNG state, model fingerprint, size and CRC-32 of each file).
// Saving is atomic: an existing checkpoint survives any failed or interrupted save. A run's
// checkpoints, every rank's committed together, are checkpoint_commit.hpp's.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "runtime/io/safetensors.hpp"

namespace alloy {

inline constexpr char kCheckpointManifest[] = "checkpoint.json";
inline constexpr char kCheckpointModelFile[] = "model.safetensors";
inline constexpr char kCheckpointOptimizerFile[] = "optimizer.safetensors";

struct CheckpointState {
  std::int64_t step = 0;                    // optimizer steps completed
  std::vector<std::uint64_t> loader_state;  // e.g. batch_loader_state_save
  std::vector<std::uint64_t> rng_state;     // any generator state as words
  std::string fingerprint;                  // identifies the model: name plus a config hash
  // JSON: where each stored tensor's elements lie in the model's full tensors, so that another
  // layout can load them (parallel/reshard.hpp); "" when not given.
  std::string global_layout;
};

struct CheckpointSaveOptions {
  // Tests only: simulate a write failure (as from a full disk) once this many bytes of the
  // checkpoint's files have been written; -1 never fails.
  std::int64_t fault_after_bytes = -1;
  // Tests only: called once the model file is written, before the optimizer's (e.g. to kill
  // the process in the middle of a save).
  std::function<void()> on_model_written;
};

// Size and CRC-32 of one file as written.
struct CheckpointFileRecord {
  std::uint64_t size_bytes = 0;
  std::uint32_t checksum = 0;
};

// The files of one rank's checkpoint, in this order, and what was written to each.
inline constexpr std::array<const char*, 3> kCheckpointFiles = {kCheckpointModelFile, kCheckpointOptimizerFile,
                                                                 kCheckpointManifest};
using CheckpointFileRecords = std::array<CheckpointFileRecord, kCheckpointFiles.size()>;

// Saves into directory `dir`: all files are written to `<dir>.tmp`, synced, and only then swap
// places with the old checkpoint (`<dir>` -> `<dir>.prev` -> removed). Until the swap completes
// the old checkpoint stays loadable; checkpoint_load falls back to `<dir>.prev` if a crash hit
// between the two renames. Refuses to replace a non-empty `dir` that is not a checkpoint.
// Returns the records of kCheckpointFiles.
CheckpointFileRecords checkpoint_save(const std::string& dir, std::span<const TensorRef> model, std::span<const TensorRef> optimizer,
                     const CheckpointState& state, const CheckpointSaveOptions& options = {});

// Reads only checkpoint.json (no tensors, no checksums).
CheckpointState checkpoint_read_state(const std::string& dir);

// Verifies and loads a checkpoint into the caller's buffers, returning its state. Checks, each
// with its own error: missing directory or file, size or checksum mismatch (corrupt file), a
// fingerprint other than `expected_fingerprint`, missing or extra tensor names, shape mismatch.
// An empty `optimizer` skips the optimizer file (weights only, e.g. for evaluation).
CheckpointState checkpoint_load(const std::string& dir, const std::string& expected_fingerprint,
                                std::span<const TensorRef> model, std::span<const TensorRef> optimizer);

}  // namespace alloy
