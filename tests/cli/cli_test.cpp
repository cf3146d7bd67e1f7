// The alloy binary as a user runs it: help, check on every shipped example, exit codes and
// messages for bad input, and commands not built yet.
#include <gtest/gtest.h>

#include <random>
#include <sstream>

#include "../common/test_util.hpp"
#include "spec/cluster.hpp"
#include "spec/model.hpp"

namespace alloy {
namespace {

using testing::CommandResult;
using testing::run_command;
using testing::TempDir;

using testing::alloy;

TEST(Cli, HelpForEverySubcommand) {
  for (const char* cmd : {"check", "plan", "simulate", "train", "profile", "explain"}) {
    CommandResult r = alloy(std::string(cmd) + " --help");
    EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
    EXPECT_NE(r.output.find("Usage"), std::string::npos) << cmd;
  }
}

TEST(Cli, CheckEveryShippedModel) {
  for (const auto& name : model_preset_names()) {
    CommandResult r = alloy("check --model " + name);
    EXPECT_EQ(r.exit_code, 0) << name << "\n" << r.output;
    EXPECT_NE(r.output.find("check: OK"), std::string::npos) << name;
  }
}

TEST(Cli, CheckEveryShippedCluster) {
  for (const auto& name : cluster_preset_names()) {
    CommandResult r = alloy("check --cluster " + name);
    EXPECT_EQ(r.exit_code, 0) << name << "\n" << r.output;
    EXPECT_NE(r.output.find("aggregate"), std::string::npos) << name;
  }
}

TEST(Cli, CheckPrintsCountsAndPeaks) {
  CommandResult r = alloy("check --model llama-2-7b --cluster a100-v100 --train " + std::string(ALLOY_SOURCE_DIR) +
                          "/examples/train/llama-pretrain.yaml");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("6,738,415,616"), std::string::npos);
  EXPECT_NE(r.output.find("FLOPs per token"), std::string::npos);
  EXPECT_NE(r.output.find("peak bf16"), std::string::npos);
  EXPECT_NE(r.output.find("infiniband"), std::string::npos);
  // The precision each device type computes in: V100s have no bf16.
  EXPECT_NE(r.output.find("Precision per device type (bf16 requested)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("a100-80gb-sxm    bf16\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("v100-32gb        fp16  (v100-32gb has no bf16"), std::string::npos) << r.output;
}

struct BadInput {
  const char* name;
  const char* file;
  const char* text;
  const char* expect;  // text the message must contain
};

const BadInput kBadInputs[] = {
    {"malformed json", "m.json", "{\"model_type\": \"gpt2\",, }", "malformed JSON"},
    {"unknown model type", "m.json", "{\"model_type\": \"gpt-2\"}", "did you mean"},
    {"heads do not divide", "m.yaml", "family: gpt2\nlayers: 2\nhidden_size: 100\nheads: 3\nvocab_size: 10\nmax_seq_len: 8\n",
     "not divisible"},
    {"kv heads", "m.yaml",
     "family: llama\nlayers: 2\nhidden_size: 64\nheads: 4\nkv_heads: 3\nvocab_size: 10\nmax_seq_len: 8\n",
     "do not divide"},
    {"zero layers", "m.yaml", "family: gpt2\nlayers: 0\nhidden_size: 64\nheads: 4\nvocab_size: 10\nmax_seq_len: 8\n",
     "positive"},
};

TEST(Cli, BadModelInputExitsTwoWithMessage) {
  TempDir dir;
  for (const auto& bad : kBadInputs) {
    std::string path = dir.write(bad.file, bad.text);
    CommandResult r = alloy("check --model " + path);
    EXPECT_EQ(r.exit_code, 2) << bad.name << "\n" << r.output;
    EXPECT_NE(r.output.find(bad.expect), std::string::npos) << bad.name << "\n" << r.output;
    EXPECT_NE(r.output.find(path), std::string::npos) << bad.name << "\n" << r.output;
    EXPECT_LE(std::count(r.output.begin(), r.output.end(), '\n'), 2) << r.output;
  }
}

TEST(Cli, BadClusterInputExitsTwoWithMessage) {
  TempDir dir;
  struct Case {
    const char* text;
    const char* expect;
  } cases[] = {
      {"nodes:\n  - {device: a100-80gb-sx, devices_per_node: 8}\n", "a100-80gb-sxm"},
      {"nodes:\n  - {device: a100-80gb-sxm, devices_per_node: 8, host_memory: -4GiB}\n", "non-negative"},
      {"nodes: [\n", "malformed YAML"},
      {"nodes: []\n", "no nodes"},
      {"nodes:\n  - {device: cpu, devices_per_node: 0}\n", "devices per node"},
  };
  for (const auto& c : cases) {
    std::string path = dir.write("c.yaml", c.text);
    CommandResult r = alloy("check --cluster " + path);
    EXPECT_EQ(r.exit_code, 2) << c.text << "\n" << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.text << "\n" << r.output;
  }
}

// The topology tree with each level's bottleneck, and a bad rack refused with exit 2.
TEST(Cli, CheckPrintsTheNetworkTopology) {
  CommandResult r = alloy("check --cluster racks-two-sites");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* line : {"site east", "rack r2: uplink 1.6 Tb/s, 2:1 oversubscribed -> 400 Gb/s per node",
                           "a100-west: 2 nodes x 8 a100-80gb-sxm", "wan between sites: ethernet 100 Gb/s per site"})
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
  TempDir dir;
  const std::string path = dir.write("c.yaml", "network: {kind: infiniband, bandwidth: 100Gb/s}\nracks: [{name: r1}]\n"
                                               "nodes:\n  - {count: 2, device: a100-80gb-sxm, devices_per_node: 8, rack: r2}\n");
  CommandResult bad = alloy("check --cluster " + path);
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("nodes[0].rack"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("unknown rack 'r2'"), std::string::npos) << bad.output;
}

TEST(Cli, MissingFileAndUnknownPreset) {
  CommandResult missing = alloy("check --model /no/such/config.json");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.output.find("cannot open"), std::string::npos) << missing.output;
  CommandResult preset = alloy("check --cluster a100-v10");
  EXPECT_EQ(preset.exit_code, 2);
  EXPECT_NE(preset.output.find("a100-v100"), std::string::npos) << preset.output;
}

TEST(Cli, SequenceLongerThanModelIsRefused) {
  TempDir dir;
  std::string train = dir.write("t.yaml", "seq_len: 4096\nglobal_batch: 8\n");
  CommandResult r = alloy("check --model gpt2 --train " + train);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("seq_len"), std::string::npos) << r.output;
}

TEST(Cli, TokenizeThenTrainThenResume) {
  TempDir dir;
  CommandResult tok = alloy("tokenize " + std::string(ALLOY_SOURCE_DIR) + "/examples/data/fsf_licenses.txt -o " +
                            dir.path() + "/fsf.bin --val-fraction 0.1");
  ASSERT_EQ(tok.exit_code, 0) << tok.output;
  std::string common = "train --model tiny-gpt --data " + dir.path() + "/fsf_train.bin --val-data " + dir.path() +
                       "/fsf_val.bin --batch 4 --seq-len 32 --threads 1 --checkpoint " + dir.path() + "/ckpt --log " +
                       dir.path() + "/log.jsonl";
  CommandResult first = alloy(common + " --steps 3");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("step     3/3"), std::string::npos) << first.output;
  EXPECT_NE(first.output.find("validation loss"), std::string::npos) << first.output;
  CommandResult resumed = alloy(common + " --steps 5 --resume");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("steps 4..5"), std::string::npos) << resumed.output;
  const std::string log = testing::read_text(dir.path() + "/log.jsonl");
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 5);
}

// The losses and gradient norms of a run's JSON-lines log, as written (full precision).
std::vector<std::string> logged(const std::string& path, const std::string& key) {
  std::vector<std::string> values;
  std::istringstream in(testing::read_text(path));
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find("\"" + key + "\":");
    if (at == std::string::npos) continue;
    const size_t begin = at + key.size() + 3;
    values.push_back(line.substr(begin, line.find_first_of(",}", begin) - begin));
  }
  return values;
}

// `alloy train` without a plan is the one-rank case of a plan's run: the planner's one-rank
// plan for the same batch trains bit for bit alike.
TEST(Cli, OneRankRunIsTheSameWithOrWithoutAPlan) {
  TempDir dir;
  const std::string source = ALLOY_SOURCE_DIR;
  ASSERT_EQ(alloy("tokenize " + source + "/examples/data/fsf_licenses.txt -o " + dir.path() + "/fsf.bin").exit_code, 0);
  const std::string setup = " --model tiny-gpt --train " + source + "/examples/train/tiny-cpu.yaml";
  CommandResult plan = alloy("plan" + setup + " --cluster local-cpu-1 --pp 1 --tp 1 --dp 1 --micro-batch 8 "
                             "--recompute none --no-offload -o " + dir.path() + "/one.json");
  ASSERT_EQ(plan.exit_code, 0) << plan.output;
  const std::string run = "train" + setup + " --data " + dir.path() + "/fsf.bin --steps 4 --threads 1 --log " + dir.path();
  CommandResult without = alloy(run + "/without.jsonl");
  ASSERT_EQ(without.exit_code, 0) << without.output;
  CommandResult with = alloy(run + "/with.jsonl --plan " + dir.path() + "/one.json");
  ASSERT_EQ(with.exit_code, 0) << with.output;
  for (const char* key : {"loss", "grad_norm"}) {
    const std::vector<std::string> a = logged(dir.path() + "/without.jsonl", key);
    const std::vector<std::string> b = logged(dir.path() + "/with.jsonl", key);
    ASSERT_EQ(a.size(), 4u) << key;
    EXPECT_EQ(a, b) << key;
  }
  EXPECT_NE(with.output.find("predicted"), std::string::npos) << "a plan's run sets measured against predicted";
}

// A plan the CUDA backend cannot run is refused before any GPU is opened: one line naming the
// stage, the feature and the backend, exit 2, on builds with and without the CUDA backend.
TEST(Cli, CudaBackendRefusesAPlanItCannotRunFirst) {
  TempDir dir;
  const std::string source = ALLOY_SOURCE_DIR;
  CommandResult plan = alloy("plan --model tiny-gpt --train " + source + "/examples/train/tiny-cpu.yaml "
                             "--cluster local-cpu-2 --tp 2 --pp 1 -o " + dir.path() + "/tp2.json");
  ASSERT_EQ(plan.exit_code, 0) << plan.output;
  CommandResult r = alloy("train --device cuda --model tiny-gpt --data /no/such.bin --plan " + dir.path() + "/tp2.json");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("stage 0 asks for tensor parallelism (tp 2), which the cuda backend does not run"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("stages[0].tp"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("without the CUDA backend"), std::string::npos) << "refused before the GPU: " << r.output;
}

TEST(Cli, TrainBadInputExitsTwo) {
  CommandResult missing = alloy("train --model tiny-gpt --data /no/such/tokens.bin --steps 1");
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("/no/such/tokens.bin"), std::string::npos) << missing.output;
  CommandResult recompute = alloy("train --model tiny-gpt --data x.bin --recompute sometimes");
  EXPECT_EQ(recompute.exit_code, 2) << recompute.output;
  EXPECT_NE(recompute.output.find("recompute"), std::string::npos) << recompute.output;
}

TEST(Cli, CorruptedFilesNeverCrashTheBinary) {
  // A sample of whole-process runs; the in-process mutation test covers thousands more.
  std::mt19937_64 rng(7);
  std::string base = testing::read_text(std::string(ALLOY_SOURCE_DIR) + "/examples/clusters/a100-v100.yaml");
  TempDir dir;
  for (int i = 0; i < 40; ++i) {
    std::string text = base;
    for (int k = 0; k < 3; ++k) text[rng() % text.size()] = static_cast<char>(32 + rng() % 95);
    std::string path = dir.write("c.yaml", text);
    CommandResult r = alloy("check --cluster " + path);
    EXPECT_EQ(r.signal, 0) << r.output;
    EXPECT_TRUE(r.exit_code == 0 || r.exit_code == 2) << r.exit_code << "\n" << r.output << "\n" << text;
  }
}

}  // namespace
}  // namespace alloy
