// A run's checkpoints committed as a whole: the manifest lists every rank's files, a step folder
// it does not commit is ignored, old steps are pruned to the last K, an edited or damaged
// manifest and files of another step are refused, and the folder's lock admits one writer.
#include "runtime/io/checkpoint_commit.hpp"

#include <algorithm>
#include <cstdint>

#include <nlohmann/json.hpp>

#include "io_test_util.hpp"

namespace alloy {
namespace {

using test::error_of;
namespace fs = std::filesystem;

constexpr char kFingerprint[] = "tiny@cfg|plan 0123";
constexpr int kRanks = 3;

// Rank r's weights at `step`: 6 floats, distinct per rank and step.
struct RankBuffers {
  std::vector<float> params, m, v;
  std::vector<TensorRef> model, optimizer;
  RankBuffers(int rank, std::int64_t step) : params(6), m(6), v(6) {
    for (size_t i = 0; i < params.size(); ++i) {
      params[i] = static_cast<float>(100 * step + 10 * rank) + static_cast<float>(i);
      m[i] = -params[i];
      v[i] = 0.5f * params[i];
    }
    model = {{"w", {2, 3}, params.data()}};
    optimizer = {{"adamw.m.w", {2, 3}, m.data()}, {"adamw.v.w", {2, 3}, v.data()}};
  }
};

CheckpointState rank_state(int rank, std::int64_t step) {
  CheckpointState state;
  state.step = step;
  state.fingerprint = std::string(kFingerprint) + "|rank " + std::to_string(rank);
  return state;
}

// Every rank writes its folder of `step`; returns their records (the commit's input).
std::vector<CheckpointFileRecords> ranks_save(const std::string& dir, std::int64_t step) {
  std::vector<CheckpointFileRecords> records;
  for (int r = 0; r < kRanks; ++r) {
    RankBuffers b(r, step);
    records.push_back(checkpoint_save(checkpoint_rank_dir(dir, step, r), b.model, b.optimizer, rank_state(r, step)));
  }
  return records;
}

void save_and_commit(const std::string& dir, std::int64_t step, int keep = 2) {
  checkpoint_commit(dir, step, kFingerprint, ranks_save(dir, step), keep);
}

// What a resuming rank does: read and check the manifest, then load its own files.
std::int64_t rank_resume(const std::string& dir, int rank, RankBuffers& into) {
  CheckpointManifest m = checkpoint_manifest_read(dir);
  checkpoint_manifest_check(m, dir, kFingerprint, kRanks, rank);
  return checkpoint_load(checkpoint_rank_dir(dir, m.step, rank), rank_state(rank, m.step).fingerprint, into.model,
                         into.optimizer)
      .step;
}

std::vector<std::string> step_folders(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().rfind("step-", 0) == 0) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

// Rewrites latest.json with `edit` applied, leaving its recorded checksum as it was.
void manifest_edit(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  const std::string path = dir + "/latest.json";
  nlohmann::json j = nlohmann::json::parse(test::bytes_read(path));
  edit(j);
  test::bytes_write(path, j.dump(2));
}

TEST(CheckpointCommit, ManifestListsEveryRanksFilesAndEachRankLoadsItsOwn) {
  test::ScratchDir scratch;
  const std::string dir = scratch.file("ck");
  save_and_commit(dir, 7);
  const CheckpointManifest m = checkpoint_manifest_read(dir);
  EXPECT_EQ(m.step, 7);
  EXPECT_EQ(m.ranks, kRanks);
  EXPECT_EQ(m.fingerprint, kFingerprint);
  EXPECT_EQ(m.files.size(), static_cast<size_t>(kRanks * 3));
  EXPECT_EQ(m.files.at("rank-00002/model.safetensors").size_bytes,
            fs::file_size(checkpoint_rank_dir(dir, 7, 2) + "/model.safetensors"));
  for (int r = 0; r < kRanks; ++r) {
    RankBuffers loaded(9, 99);
    EXPECT_EQ(rank_resume(dir, r, loaded), 7);
    EXPECT_EQ(loaded.params, RankBuffers(r, 7).params) << "rank " << r;
    EXPECT_EQ(loaded.v, RankBuffers(r, 7).v) << "rank " << r;
  }
}

TEST(CheckpointCommit, UncommittedStepFolderIsIgnoredAndRemovedByTheNextCommit) {
  test::ScratchDir scratch;
  const std::string dir = scratch.file("ck");
  save_and_commit(dir, 4);
  // A save of step 5 that ranks 0 and 1 finished and rank 2 never did (killed): no commit.
  for (int r = 0; r < 2; ++r) {
    RankBuffers b(r, 5);
    checkpoint_save(checkpoint_rank_dir(dir, 5, r), b.model, b.optimizer, rank_state(r, 5));
  }
  RankBuffers loaded(9, 99);
  EXPECT_EQ(rank_resume(dir, 2, loaded), 4);
  EXPECT_EQ(loaded.params, RankBuffers(2, 4).params);
  EXPECT_EQ(step_folders(dir), (std::vector<std::string>{"step-00000004", "step-00000005"}));
  // Resumed from 4, the run commits 5 again with every rank's files of this save.
  save_and_commit(dir, 5);
  EXPECT_EQ(rank_resume(dir, 2, loaded), 5);
  EXPECT_EQ(loaded.params, RankBuffers(2, 5).params);
}

TEST(CheckpointCommit, PruneKeepsTheLastK) {
  test::ScratchDir scratch;
  const std::string dir = scratch.file("ck");
  for (std::int64_t step : {2, 4, 6, 8}) save_and_commit(dir, step);
  EXPECT_EQ(step_folders(dir), (std::vector<std::string>{"step-00000006", "step-00000008"}));
  EXPECT_EQ(checkpoint_manifest_read(dir).steps_kept, (std::vector<std::int64_t>{6, 8}));
  save_and_commit(dir, 10, 1);
  EXPECT_EQ(step_folders(dir), (std::vector<std::string>{"step-00000010"}));
  save_and_commit(dir, 12, 3);
  save_and_commit(dir, 14, 3);
  EXPECT_EQ(step_folders(dir), (std::vector<std::string>{"step-00000010", "step-00000012", "step-00000014"}));
  // A leftover folder of a later step (a killed run's unfinished save) is pruned too.
  ranks_save(dir, 30);
  save_and_commit(dir, 16, 1);
  EXPECT_EQ(step_folders(dir), (std::vector<std::string>{"step-00000016"}));
}

TEST(CheckpointCommit, EditedManifestIsRefusedByItsChecksum) {
  test::ScratchDir scratch;
  const std::string dir = scratch.file("ck");
  save_and_commit(dir, 20);
  for (std::int64_t step : {-5, 10}) {
    save_and_commit(dir, 20);
    manifest_edit(dir, [&](nlohmann::json& j) { j["step"] = step; });
    Error e = error_of([&] { checkpoint_manifest_read(dir); });
    EXPECT_NE(e.message().find("damaged or was edited"), std::string::npos) << e.format();
    EXPECT_EQ(e.where().field, "checksum");
    EXPECT_NE(e.where().file.find("latest.json"), std::string::npos);
  }
  test::bytes_write(dir + "/latest.json", "{\"format\": \"alloy-checkpoint-set\", \"ver");
  Error truncated = error_of([&] { checkpoint_manifest_read(dir); });
  EXPECT_NE(truncated.message().find("not valid JSON"), std::string::npos) << truncated.format();
}

TEST(CheckpointCommit, MissingManifestOrOldFormatSaysHowToGoOn) {
  test::ScratchDir scratch;
  const std::string dir = scratch.file("ck");
  Error absent = error_of([&] { checkpoint_manifest_read(dir); });
  EXPECT_NE(absent.message().find("not found"), std::string::npos) << absent.format();

  ranks_save(dir, 3);  // written, never committed
  Error uncommitted = error_of([&] { checkpoint_manifest_read(dir); });
  EXPECT_NE(uncommitted.message().find("no committed checkpoint"), std::string::npos) << uncommitted.format();
  EXPECT_NE(uncommitted.hint().find("without --resume"), std::string::npos) << uncommitted.format();

  const std::string old = scratch.file("old");
  RankBuffers b(0, 1);
  checkpoint_save(old + "/rank-00000", b.model, b.optimizer, rank_state(0, 1));
  Error old_format = error_of([&] { checkpoint_manifest_read(old); });
  EXPECT_NE(old_format.message().find("older format"), std::string::npos) << old_format.format();
}

TEST(CheckpointCommit, FilesOfAnotherStepOrRunAreRefused) {
  test::ScratchDir scratch;
  const std::string dir = scratch.file("ck");
  save_and_commit(dir, 3);
  save_and_commit(dir, 6);
  // Rank 1's folder of step 6 replaced by its folder of step 3: its files differ from the commit.
  fs::remove_all(checkpoint_rank_dir(dir, 6, 1));
  fs::copy(checkpoint_rank_dir(dir, 3, 1), checkpoint_rank_dir(dir, 6, 1));
  const CheckpointManifest m = checkpoint_manifest_read(dir);
  checkpoint_manifest_check(m, dir, kFingerprint, kRanks, 0);
  Error stale = error_of([&] { checkpoint_manifest_check(m, dir, kFingerprint, kRanks, 1); });
  EXPECT_NE(stale.message().find("differs from the one committed"), std::string::npos) << stale.format();
  EXPECT_NE(stale.where().file.find("rank-00001"), std::string::npos) << stale.format();

  Error ranks = error_of([&] { checkpoint_manifest_check(m, dir, kFingerprint, 4, 0); });
  EXPECT_NE(ranks.hint().find("mpirun -np 3"), std::string::npos) << ranks.format();
  Error other = error_of([&] { checkpoint_manifest_check(m, dir, "other|plan 9", kRanks, 0); });
  EXPECT_EQ(other.where().field, "fingerprint");
}

TEST(CheckpointCommit, LockAdmitsOneWriterAndIsReleasedWithIt) {
  test::ScratchDir scratch;
  const std::string dir = scratch.file("ck");
  {
    CheckpointLock first(dir);
    Error second = error_of([&] { CheckpointLock again(dir); });
    EXPECT_NE(second.message().find("another run is writing"), std::string::npos) << second.format();
    EXPECT_NE(second.message().find("pid " + std::to_string(getpid())), std::string::npos) << second.format();
    EXPECT_EQ(second.where().file, dir);
  }
  CheckpointLock after(dir);  // released when the first went
}

}  // namespace
}  // namespace alloy
