// Checkpoints of every rank committed together by one manifest (see checkpoint_commit.hpp).
#include "runtime/io/checkpoint_commit.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/io/file_io.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace fs = std::filesystem;

namespace {

constexpr char kSetFormatName[] = "alloy-checkpoint-set";
constexpr int kSetFormatVersion = 1;
constexpr char kStepPrefix[] = "step-";

std::string rank_name(int rank) { return fmt::format("rank-{:05d}", rank); }

// The step of a folder named step-NNNNNNNN; -1 for any other name.
std::int64_t step_of_folder(const std::string& name) {
  const std::string prefix = kStepPrefix;
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return -1;
  const std::string digits = name.substr(prefix.size());
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return -1;
  return std::stoll(digits);
}

// CRC-32 of the manifest's compact text without its "checksum" field (keys are sorted).
std::string manifest_checksum(nlohmann::json body) {
  body.erase("checksum");
  const std::string text = body.dump();
  return checksum_hex(crc32_update(0, std::as_bytes(std::span(text.data(), text.size()))));
}

nlohmann::json manifest_to_json(const CheckpointManifest& m) {
  nlohmann::json files = nlohmann::json::object();
  for (const auto& [name, record] : m.files)
    files[name] = {{"bytes", record.size_bytes}, {"crc32", checksum_hex(record.checksum)}};
  nlohmann::json body = {{"format", kSetFormatName}, {"version", kSetFormatVersion}, {"step", m.step},
                         {"fingerprint", m.fingerprint}, {"ranks", m.ranks}, {"steps_kept", m.steps_kept},
                         {"files", files}};
  if (m.loss_scale > 0) body["loss_scale"] = {{"scale", m.loss_scale}, {"good_steps", m.loss_scale_good_steps}};
  body["checksum"] = manifest_checksum(body);
  return body;
}

[[noreturn]] void manifest_damaged(const std::string& path, const std::string& field, const std::string& what) {
  throw Error("the checkpoint manifest is damaged or was edited: " + what, io_where(path, field),
              "restore the checkpoint folder from a copy, or start afresh without --resume; never edit latest.json");
}

CheckpointManifest manifest_from_json(const nlohmann::json& j, const std::string& path) {
  CheckpointManifest m;
  try {
    m.step = j.at("step").get<std::int64_t>();
    m.fingerprint = j.at("fingerprint").get<std::string>();
    m.ranks = j.at("ranks").get<int>();
    m.steps_kept = j.at("steps_kept").get<std::vector<std::int64_t>>();
    if (j.contains("loss_scale")) {
      m.loss_scale = j.at("loss_scale").at("scale").get<double>();
      m.loss_scale_good_steps = j.at("loss_scale").at("good_steps").get<std::int64_t>();
    }
    for (const auto& [name, record] : j.at("files").items()) {
      const std::string crc = record.at("crc32").get<std::string>();
      m.files[name] = {record.at("bytes").get<std::uint64_t>(), static_cast<std::uint32_t>(std::stoul(crc, nullptr, 16))};
    }
  } catch (const std::exception& e) {
    manifest_damaged(path, "", std::string("a field is missing or malformed (") + e.what() + ")");
  }
  // Step 0: weights to start from (alloy import-hf), no step run yet.
  if (m.step < 0 || m.ranks < 1) manifest_damaged(path, "step", "the step must be 0 or more and the rank count positive");
  if (j.contains("loss_scale") && (!(m.loss_scale >= 1 && m.loss_scale <= 0x1p64) || m.loss_scale_good_steps < 0))
    manifest_damaged(path, "loss_scale", "the loss scale must be from 1 to 2^64 and its good steps 0 or more");
  return m;
}

// Why `dir` has no latest.json, as an error that says what to do.
[[noreturn]] void manifest_missing(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw Error("checkpoint folder not found", io_where(dir), "check the path given to --checkpoint");
  if (fs::exists(fs::path(dir) / kCheckpointManifest, ec) || fs::exists(fs::path(dir) / "rank-00000", ec))
    throw Error("this folder holds a checkpoint in the older format (one folder per rank, no latest.json), which "
                "this version cannot resume",
                io_where(dir), "continue that run with the Alloy version that wrote it, or start afresh in a new "
                               "--checkpoint folder without --resume");
  throw Error(fmt::format("no committed checkpoint: {} is missing, so no save here completed", kCheckpointLatest),
              io_where(dir), "start afresh without --resume (step folders without latest.json are unfinished saves)");
}

// The steps the new manifest keeps: the previous manifest's that precede `step`, then `step`.
std::vector<std::int64_t> steps_to_keep(const std::string& dir, std::int64_t step, int keep) {
  std::vector<std::int64_t> kept;
  std::error_code ec;
  if (fs::exists(fs::path(dir) / kCheckpointLatest, ec)) {
    try {
      for (std::int64_t s : checkpoint_manifest_read(dir).steps_kept)
        if (s < step) kept.push_back(s);
    } catch (const Error&) {
      // A damaged previous manifest keeps nothing but the step being committed.
    }
  }
  kept.push_back(step);
  if (kept.size() > static_cast<size_t>(keep)) kept.erase(kept.begin(), kept.end() - keep);
  return kept;
}

// Removes step folders not in `kept` and temporary manifests a killed commit left.
void folders_prune(const std::string& dir, const std::vector<std::int64_t>& kept) {
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const std::int64_t step = step_of_folder(name);
    const bool stale_temp = name.rfind(std::string(kCheckpointLatest) + ".tmp", 0) == 0;
    if ((step >= 0 && std::find(kept.begin(), kept.end(), step) == kept.end()) || stale_temp)
      fs::remove_all(entry.path(), ec);
  }
}

std::string lock_holder(int fd) {
  char text[256] = {0};
  const ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
  std::string holder = n > 0 ? std::string(text, static_cast<size_t>(n)) : std::string();
  while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
  return holder;
}

}  // namespace

std::string checkpoint_step_dir(const std::string& dir, std::int64_t step) {
  return (fs::path(dir) / fmt::format("{}{:08d}", kStepPrefix, step)).string();
}

std::string checkpoint_rank_dir(const std::string& dir, std::int64_t step, int rank) {
  return (fs::path(checkpoint_step_dir(dir, step)) / rank_name(rank)).string();
}

void checkpoint_commit(const std::string& dir, std::int64_t step, const std::string& fingerprint,
                       const std::vector<CheckpointFileRecords>& records, int keep, double loss_scale,
                       std::int64_t loss_scale_good_steps) {
  CheckpointManifest m;
  m.step = step;
  m.loss_scale = loss_scale;
  m.loss_scale_good_steps = loss_scale_good_steps;
  m.fingerprint = fingerprint;
  m.ranks = static_cast<int>(records.size());
  m.steps_kept = steps_to_keep(dir, step, keep);
  for (size_t r = 0; r < records.size(); ++r)
    for (size_t f = 0; f < kCheckpointFiles.size(); ++f)
      m.files[rank_name(static_cast<int>(r)) + "/" + kCheckpointFiles[f]] = records[r][f];
  const std::string text = manifest_to_json(m).dump(2) + "\n";
  file_write_atomic((fs::path(dir) / kCheckpointLatest).string(),
                    [&](FileWriter& writer) { writer.write(text.data(), text.size()); });
  folders_prune(dir, m.steps_kept);
}

CheckpointManifest checkpoint_manifest_read(const std::string& dir) {
  const std::string path = (fs::path(dir) / kCheckpointLatest).string();
  std::error_code ec;
  if (!fs::exists(path, ec)) manifest_missing(dir);
  nlohmann::json j;
  try {
    const MappedFile mapped = mapped_file_open(path, "checkpoint manifest");
    const char* text = reinterpret_cast<const char*>(mapped.bytes().data());
    j = nlohmann::json::parse(text, text + mapped.size_bytes());
  } catch (const nlohmann::json::parse_error& e) {
    manifest_damaged(path, "", std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object() || j.value("format", "") != kSetFormatName)
    throw Error("not an Alloy checkpoint manifest", io_where(path, "format"), "pass a folder written by `alloy train`");
  if (j.value("version", 0) != kSetFormatVersion)
    throw Error("unsupported checkpoint version " + j["version"].dump(), io_where(path, "version"),
                "resume it with the Alloy version that wrote it");
  const std::string recorded = j.value("checksum", "");
  const std::string actual = manifest_checksum(j);
  if (recorded != actual)
    manifest_damaged(path, "checksum", fmt::format("its contents hash to {}, not the recorded '{}'", actual, recorded));
  return manifest_from_json(j, path);
}

void checkpoint_manifest_check(const CheckpointManifest& manifest, const std::string& dir,
                               const std::string& fingerprint, int ranks, int rank) {
  const std::string path = (fs::path(dir) / kCheckpointLatest).string();
  if (manifest.fingerprint != fingerprint)
    throw Error(fmt::format("the checkpoint is for \"{}\", but this run is \"{}\"", manifest.fingerprint, fingerprint),
                io_where(path, "fingerprint"), "resume with the model and plan the checkpoint was written with, or start afresh");
  if (manifest.ranks != ranks)
    throw Error(fmt::format("the checkpoint was written by {} ranks, and this run has {}", manifest.ranks, ranks),
                io_where(path, "ranks"), fmt::format("resume with mpirun -np {} and the same plan", manifest.ranks));
  checkpoint_manifest_check_files(manifest, dir, rank);
}

void checkpoint_manifest_check_files(const CheckpointManifest& manifest, const std::string& dir, int rank) {
  const std::string path = (fs::path(dir) / kCheckpointLatest).string();
  const std::string rank_dir = checkpoint_rank_dir(dir, manifest.step, rank);
  for (const char* name : kCheckpointFiles) {
    const std::string key = rank_name(rank) + "/" + name;
    const auto it = manifest.files.find(key);
    if (it == manifest.files.end()) manifest_damaged(path, "files", key + " is not listed");
    const std::string file = (fs::path(rank_dir) / name).string();
    if (!fs::exists(file))
      throw Error("checkpoint file missing", io_where(file),
                  "the checkpoint is incomplete: copy the whole folder, or start afresh without --resume");
    const MappedFile mapped = mapped_file_open(file, "checkpoint file");
    const std::uint32_t crc = crc32_update_parallel(0, mapped.bytes());
    if (mapped.size_bytes() != it->second.size_bytes || crc != it->second.checksum)
      throw Error(fmt::format("file differs from the one committed: {} bytes, CRC-32 {}; latest.json recorded {} bytes, "
                              "CRC-32 {}",
                              mapped.size_bytes(), checksum_hex(crc), it->second.size_bytes, checksum_hex(it->second.checksum)),
                  io_where(file), "restore the checkpoint folder from a copy, or start afresh without --resume");
  }
}

CheckpointLock::CheckpointLock(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  const std::string path = (fs::path(dir) / kCheckpointLock).string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw Error(fmt::format("cannot open the checkpoint lock: {}", std::strerror(errno)), io_where(path),
                "check that the --checkpoint folder can be written");
  if (flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const std::string holder = lock_holder(fd_);
    ::close(fd_);
    fd_ = -1;
    throw Error(fmt::format("another run is writing checkpoints into this folder{}",
                            holder.empty() ? "" : " (" + holder + ")"),
                io_where(dir), "wait for that run to end, or give this run another --checkpoint folder");
  }
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  const std::string holder = fmt::format("pid {} on host {}\n", getpid(), host);
  if (ftruncate(fd_, 0) == 0 && pwrite(fd_, holder.data(), holder.size(), 0) < 0) {
    // The pid is only for messages; the lock itself is held.
  }
}

CheckpointLock::~CheckpointLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace alloy
