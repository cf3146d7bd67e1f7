// Checkpoints: round trip of tensors and state, atomic replacement that survives failed writes,
// and one error per kind of damaged or mismatched checkpoint.
#include "runtime/io/checkpoint.hpp"

#include <cstdint>
#include <cstdlib>
#include <limits>

#include "io_test_util.hpp"

namespace alloy {
namespace {

using test::error_of;
namespace fs = std::filesystem;

// A model's flat parameter buffer and its optimizer's m and v, with named views into them.
struct Buffers {
  std::vector<float> params, m, v;
  std::vector<TensorRef> model, optimizer;

  explicit Buffers(float base) : params(14), m(14), v(14) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      params[i] = base + 0.25f * i;
      m[i] = base - 0.5f * i;
      v[i] = base * 0.001f + i;
    }
    model = {{"wte.weight", {3, 4}, params.data()}, {"ln_f.weight", {2}, params.data() + 12}};
    for (const auto& [prefix, buffer] : {std::pair{"opt.m.", &m}, std::pair{"opt.v.", &v}}) {
      for (const auto& view : model) {
        optimizer.push_back({prefix + view.name, view.shape, buffer->data() + (view.data - params.data())});
      }
    }
  }
};

CheckpointState state_of(std::int64_t step) {
  CheckpointState state;
  state.step = step;
  state.loader_state = {1, 42, static_cast<std::uint64_t>(step), 8, 64, 0};
  state.rng_state = {std::numeric_limits<std::uint64_t>::max(), 0, 0x0123456789abcdefull};
  state.fingerprint = "gpt2-tiny:cfg=1a2b3c";
  return state;
}

void expect_loads(const std::string& dir, const Buffers& expected, std::int64_t step) {
  Buffers loaded(-100.0f);
  CheckpointState state = checkpoint_load(dir, "gpt2-tiny:cfg=1a2b3c", loaded.model, loaded.optimizer);
  EXPECT_EQ(state.step, step);
  EXPECT_EQ(state.loader_state, state_of(step).loader_state);
  EXPECT_EQ(state.rng_state, state_of(step).rng_state);
  EXPECT_EQ(state.fingerprint, "gpt2-tiny:cfg=1a2b3c");
  EXPECT_EQ(loaded.params, expected.params);
  EXPECT_EQ(loaded.m, expected.m);
  EXPECT_EQ(loaded.v, expected.v);
}

std::vector<std::string> dir_listing(const std::string& parent) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(parent)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

void byte_flip(const std::string& path, std::size_t offset_from_end) {
  std::string bytes = test::bytes_read(path);
  bytes[bytes.size() - offset_from_end] ^= 0x01;
  test::bytes_write(path, bytes);
}

TEST(Checkpoint, RoundTripsTensorsAndState) {
  test::ScratchDir scratch;
  Buffers saved(1.5f);
  std::string dir = scratch.file("ckpt");
  checkpoint_save(dir, saved.model, saved.optimizer, state_of(120));
  expect_loads(dir, saved, 120);
  EXPECT_EQ(checkpoint_read_state(dir + "/").step, 120);
  // The weights file is a plain safetensors file that tells which model and step it holds.
  SafetensorsFile weights = safetensors_open(dir + "/model.safetensors");
  EXPECT_EQ(weights.metadata().at("alloy.fingerprint"), "gpt2-tiny:cfg=1a2b3c");
  EXPECT_EQ(weights.metadata().at("alloy.step"), "120");
  EXPECT_EQ(weights.entries().size(), 2u);
}

TEST(Checkpoint, ManifestChecksumsAreZlibCrc32) {
  if (!fs::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
  test::ScratchDir scratch;
  Buffers saved(1.5f);
  std::string dir = scratch.file("ckpt");
  checkpoint_save(dir, saved.model, saved.optimizer, state_of(5));
  // Exit status 0 only if zlib agrees with every recorded checksum and size.
  std::string script =
      "import json, os, sys, zlib; d = sys.argv[1]; m = json.load(open(os.path.join(d, 'checkpoint.json')));"
      "ok = all(format(zlib.crc32(open(os.path.join(d, n), 'rb').read()), '08x') == r['crc32'] and "
      "os.path.getsize(os.path.join(d, n)) == r['bytes'] for n, r in m['files'].items());"
      "sys.exit(0 if ok and len(m['files']) == 2 else 1)";
  std::string command = "/usr/bin/python3 -c \"" + script + "\" " + dir;
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
}

TEST(Checkpoint, WeightsOnlyLoadSkipsOptimizer) {
  test::ScratchDir scratch;
  Buffers saved(2.0f);
  std::string dir = scratch.file("ckpt");
  checkpoint_save(dir, saved.model, saved.optimizer, state_of(3));
  fs::remove(dir + "/optimizer.safetensors");
  Buffers loaded(0.0f);
  checkpoint_load(dir, "gpt2-tiny:cfg=1a2b3c", loaded.model, {});
  EXPECT_EQ(loaded.params, saved.params);
}

TEST(Checkpoint, SaveReplacesOldCheckpointAndLeavesNoTemporaries) {
  test::ScratchDir scratch;
  std::string dir = scratch.file("ckpt");
  checkpoint_save(dir, Buffers(1.0f).model, Buffers(1.0f).optimizer, state_of(10));
  Buffers newer(7.0f);
  checkpoint_save(dir, newer.model, newer.optimizer, state_of(20));
  expect_loads(dir, newer, 20);
  EXPECT_EQ(dir_listing(fs::path(dir).parent_path()), std::vector<std::string>{"ckpt"});
  EXPECT_EQ(dir_listing(dir),
            (std::vector<std::string>{"checkpoint.json", "model.safetensors", "optimizer.safetensors"}));
}

TEST(Checkpoint, FailedSaveAtAnyPointKeepsTheOldCheckpoint) {
  test::ScratchDir scratch;
  std::string dir = scratch.file("ckpt");
  Buffers old(1.0f);
  checkpoint_save(dir, old.model, old.optimizer, state_of(10));
  std::int64_t total_bytes = 0;
  for (const auto& entry : fs::directory_iterator(dir)) total_bytes += fs::file_size(entry.path());
  Buffers newer(9.0f);
  // Fail in the first bytes, inside the weights, inside the optimizer file, and in the manifest.
  for (std::int64_t fault :
       {std::int64_t{0}, std::int64_t{5}, std::int64_t{100}, total_bytes / 2, total_bytes - 200, total_bytes - 1}) {
    CheckpointSaveOptions options;
    options.fault_after_bytes = fault;
    Error e = error_of([&] { checkpoint_save(dir, newer.model, newer.optimizer, state_of(20), options); });
    EXPECT_ERROR_SAYS(e, "write failed");
    expect_loads(dir, old, 10);
    EXPECT_EQ(dir_listing(fs::path(dir).parent_path()), std::vector<std::string>{"ckpt"})
        << "fault after " << fault << " bytes";
  }
  CheckpointSaveOptions enough;
  enough.fault_after_bytes = total_bytes;
  checkpoint_save(dir, newer.model, newer.optimizer, state_of(20), enough);
  expect_loads(dir, newer, 20);
}

TEST(Checkpoint, CrashBetweenRenamesFallsBackToPrevious) {
  test::ScratchDir scratch;
  std::string dir = scratch.file("ckpt");
  Buffers old(3.0f);
  checkpoint_save(dir, old.model, old.optimizer, state_of(30));
  fs::rename(dir, dir + ".prev");  // where a crash between the two renames leaves things
  expect_loads(dir, old, 30);
  CheckpointSaveOptions failing;
  failing.fault_after_bytes = 100;
  Buffers lost(5.0f);
  error_of([&] { checkpoint_save(dir, lost.model, lost.optimizer, state_of(50), failing); });
  expect_loads(dir, old, 30);
  Buffers newer(4.0f);
  checkpoint_save(dir, newer.model, newer.optimizer, state_of(40));
  expect_loads(dir, newer, 40);
}

TEST(Checkpoint, RefusesToReplaceADirectoryThatIsNotACheckpoint) {
  test::ScratchDir scratch;
  std::string dir = scratch.file("data");
  fs::create_directories(dir);
  test::bytes_write(dir + "/notes.txt", "precious");
  Buffers b(1.0f);
  Error e = error_of([&] { checkpoint_save(dir, b.model, b.optimizer, state_of(1)); });
  EXPECT_EQ(e.where().file, dir);
  EXPECT_ERROR_SAYS(e, "not an Alloy checkpoint");
  EXPECT_EQ(test::bytes_read(dir + "/notes.txt"), "precious");
}

TEST(Checkpoint, MissingDirectoryOrFiles) {
  test::ScratchDir scratch;
  Buffers b(1.0f);
  std::string dir = scratch.file("ckpt");
  Error no_dir = error_of([&] { checkpoint_load(dir, "x", b.model, b.optimizer); });
  EXPECT_EQ(no_dir.where().file, dir);
  EXPECT_ERROR_SAYS(no_dir, "not found");

  checkpoint_save(dir, b.model, b.optimizer, state_of(1));
  fs::remove(dir + "/optimizer.safetensors");
  Error no_opt = error_of([&] { checkpoint_load(dir, "gpt2-tiny:cfg=1a2b3c", b.model, b.optimizer); });
  EXPECT_EQ(no_opt.where().file, dir + "/optimizer.safetensors");
  EXPECT_ERROR_SAYS(no_opt, "missing");

  fs::remove(dir + "/checkpoint.json");
  Error no_manifest = error_of([&] { checkpoint_load(dir, "gpt2-tiny:cfg=1a2b3c", b.model, b.optimizer); });
  EXPECT_EQ(no_manifest.where().file, dir + "/checkpoint.json");
  EXPECT_ERROR_SAYS(no_manifest, "not found");
}

TEST(Checkpoint, CorruptFilesAreDetected) {
  test::ScratchDir scratch;
  Buffers b(1.0f);
  std::string dir = scratch.file("ckpt");
  checkpoint_save(dir, b.model, b.optimizer, state_of(1));
  std::string weights = dir + "/model.safetensors";
  std::string pristine = test::bytes_read(weights);

  byte_flip(weights, 3);  // one bit of the last float
  Error flipped = error_of([&] { checkpoint_load(dir, "gpt2-tiny:cfg=1a2b3c", b.model, b.optimizer); });
  EXPECT_EQ(flipped.where().file, weights);
  EXPECT_EQ(flipped.where().field, "crc32");
  EXPECT_ERROR_SAYS(flipped, "corrupt");

  test::bytes_write(weights, pristine.substr(0, pristine.size() - 4));
  Error truncated = error_of([&] { checkpoint_load(dir, "gpt2-tiny:cfg=1a2b3c", b.model, b.optimizer); });
  EXPECT_EQ(truncated.where().file, weights);
  EXPECT_ERROR_SAYS(truncated, "corrupt");
  EXPECT_ERROR_SAYS(truncated, std::to_string(pristine.size()));

  test::bytes_write(weights, pristine);
  test::bytes_write(dir + "/checkpoint.json", "{\"format\": \"alloy-checkpoint\", ");
  Error manifest = error_of([&] { checkpoint_load(dir, "gpt2-tiny:cfg=1a2b3c", b.model, b.optimizer); });
  EXPECT_EQ(manifest.where().file, dir + "/checkpoint.json");
  EXPECT_ERROR_SAYS(manifest, "corrupt");
}

TEST(Checkpoint, FingerprintMismatchNamesBothModels) {
  test::ScratchDir scratch;
  Buffers b(1.0f);
  std::string dir = scratch.file("ckpt");
  checkpoint_save(dir, b.model, b.optimizer, state_of(1));
  Error e = error_of([&] { checkpoint_load(dir, "llama-tiny:cfg=999", b.model, b.optimizer); });
  EXPECT_EQ(e.where().file, dir + "/checkpoint.json");
  EXPECT_EQ(e.where().field, "fingerprint");
  EXPECT_ERROR_SAYS(e, "gpt2-tiny:cfg=1a2b3c");
  EXPECT_ERROR_SAYS(e, "llama-tiny:cfg=999");
}

TEST(Checkpoint, TensorNamesAndShapesMustMatch) {
  test::ScratchDir scratch;
  Buffers b(1.0f);
  std::string dir = scratch.file("ckpt");
  checkpoint_save(dir, b.model, b.optimizer, state_of(1));
  const std::string weights = dir + "/model.safetensors";
  const std::string fp = "gpt2-tiny:cfg=1a2b3c";

  std::vector<TensorRef> fewer = {b.model[0]};
  Error extra = error_of([&] { checkpoint_load(dir, fp, fewer, b.optimizer); });
  EXPECT_EQ(extra.where().file, weights);
  EXPECT_EQ(extra.where().field, "ln_f.weight");

  std::vector<TensorRef> more = b.model;
  more.push_back({"lm_head.weight", {2}, b.params.data()});
  Error missing = error_of([&] { checkpoint_load(dir, fp, more, b.optimizer); });
  EXPECT_EQ(missing.where().field, "lm_head.weight");
  EXPECT_ERROR_SAYS(missing, "missing");

  std::vector<TensorRef> optimizer = b.optimizer;
  optimizer[1].shape = {1, 2};
  Error shape = error_of([&] { checkpoint_load(dir, fp, b.model, optimizer); });
  EXPECT_EQ(shape.where().file, dir + "/optimizer.safetensors");
  EXPECT_EQ(shape.where().field, "opt.m.ln_f.weight");
  EXPECT_ERROR_SAYS(shape, "[1, 2]");
}

}  // namespace
}  // namespace alloy
