// A run's checkpoints, every rank's committed together. Each save writes step N beside the
// previous ones, one folder per rank:
//   <dir>/step-00000028/rank-00003/{model,optimizer}.safetensors, checkpoint.json
// and, once every rank has written its folder, one manifest <dir>/latest.json (step, layout
// fingerprint, rank count, every file's size and CRC-32, the steps kept, and a CRC-32 of the
// manifest itself) replaces the previous one atomically. Only latest.json makes a step a
// checkpoint: a step folder it does not list is ignored on resume and removed by the next commit.
// <dir>/.lock keeps a second run from writing into the same folder.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/io/checkpoint.hpp"

namespace alloy {

inline constexpr char kCheckpointLatest[] = "latest.json";
inline constexpr char kCheckpointLock[] = ".lock";

// <dir>/step-NNNNNNNN and <dir>/step-NNNNNNNN/rank-RRRRR.
std::string checkpoint_step_dir(const std::string& dir, std::int64_t step);
std::string checkpoint_rank_dir(const std::string& dir, std::int64_t step, int rank);

// What latest.json says.
struct CheckpointManifest {
  std::int64_t step = 0;
  std::string fingerprint;  // the model and the plan's layout (not a rank's)
  int ranks = 0;
  std::vector<std::int64_t> steps_kept;  // committed steps whose folders stay, oldest first
  std::map<std::string, CheckpointFileRecord> files;  // "rank-00003/model.safetensors" -> record
  // Dynamic loss scaling's state after `step` (the same on every rank); 0: not recorded.
  double loss_scale = 0;
  std::int64_t loss_scale_good_steps = 0;
};

// Writes latest.json for `step` (temp file, fsync, rename, fsync of `dir`), listing every rank's
// files (`records[r]` as rank r's checkpoint_save returned them); then removes every step folder
// but the last `keep` committed ones. The caller makes sure all ranks have finished writing.
// `loss_scale` > 0 records dynamic loss scaling's scale and good-step count with it.
void checkpoint_commit(const std::string& dir, std::int64_t step, const std::string& fingerprint,
                       const std::vector<CheckpointFileRecords>& records, int keep, double loss_scale = 0,
                       std::int64_t loss_scale_good_steps = 0);

// Reads and verifies latest.json: format, version and its own checksum. Errors name the folder
// and say what to do for a folder with no committed save, or one in the older per-rank format.
CheckpointManifest checkpoint_manifest_read(const std::string& dir);

// Checks the manifest against this run (fingerprint, rank count) and `rank`'s files against
// their recorded sizes and checksums.
void checkpoint_manifest_check(const CheckpointManifest& manifest, const std::string& dir,
                               const std::string& fingerprint, int ranks, int rank);
// Only the files: `rank`'s against their recorded sizes and checksums.
void checkpoint_manifest_check_files(const CheckpointManifest& manifest, const std::string& dir, int rank);

// An exclusive lock on <dir>/.lock (created with `dir`), released when this object goes or the
// process dies. A folder another process holds is refused, naming that process's pid and host.
class CheckpointLock {
 public:
  explicit CheckpointLock(const std::string& dir);
  CheckpointLock(const CheckpointLock&) = delete;
  CheckpointLock& operator=(const CheckpointLock&) = delete;
  ~CheckpointLock();

 private:
  int fd_ = -1;
};

}  // namespace alloy
