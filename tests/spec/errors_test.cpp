// Every kind of bad spec input ends in an alloy::Error that names the file and field and
// says how to fix it.
#include <gtest/gtest.h>

#include "../common/test_util.hpp"
#include "hw/catalog.hpp"
#include "spec/cluster.hpp"
#include "spec/error.hpp"
#include "spec/model.hpp"
#include "spec/train.hpp"

namespace alloy {
namespace {

using testing::TempDir;

const char* kGoodLlama = R"({
  "model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
  "num_attention_heads": 8, "num_key_value_heads": 4, "max_position_embeddings": 128,
  "vocab_size": 1000, "rms_norm_eps": 1e-5
})";

const char* kGoodCluster = R"(name: t
network: {kind: infiniband, bandwidth: 200Gb/s, latency: 5us}
nodes:
  - {count: 2, device: a100-80gb-sxm, devices_per_node: 8, host_memory: 1TiB}
)";

// Loads and returns the formatted error; fails the test when nothing is thrown.
template <typename Load>
Error expect_error(Load load) {
  try {
    load();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected alloy::Error";
  return Error("none");
}

std::string replace(std::string text, const std::string& from, const std::string& to) {
  size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

TEST(SpecErrors, GoodInputsLoad) {
  TempDir dir;
  EXPECT_NO_THROW(model_load_file(dir.write("m.json", kGoodLlama)));
  EXPECT_NO_THROW(cluster_load(dir.write("c.yaml", kGoodCluster), catalog_builtin()));
}

TEST(SpecErrors, MissingFile) {
  Error e = expect_error([] { model_load("/nonexistent/config.json"); });
  EXPECT_EQ(e.where().file, "/nonexistent/config.json");
  EXPECT_NE(e.message().find("cannot open"), std::string::npos);
  EXPECT_FALSE(e.hint().empty());
}

TEST(SpecErrors, MalformedJsonHasLineAndColumn) {
  TempDir dir;
  std::string path = dir.write("m.json", "{\n  \"model_type\": \"llama\",\n  \"hidden_size\": 256,,\n}");
  Error e = expect_error([&] { model_load_file(path); });
  EXPECT_EQ(e.where().line, 3);
  EXPECT_GT(e.where().column, 0);
  EXPECT_NE(e.message().find("malformed JSON"), std::string::npos);
}

TEST(SpecErrors, JsonNumberBeyondADoubleIsACleanError) {
  TempDir dir;
  std::string path = dir.write("m.json", "{\"model_type\": \"llama\", \"hidden_size\": 1e3084096}");
  Error e = expect_error([&] { model_load_file(path); });
  EXPECT_EQ(e.where().file, path);
  EXPECT_NE(e.message().find("number overflow"), std::string::npos) << e.format();
}

TEST(SpecErrors, MalformedYamlHasLineAndColumn) {
  TempDir dir;
  std::string path = dir.write("c.yaml", "name: t\nnodes:\n  - {count: 2, device: [a100\n");
  Error e = expect_error([&] { cluster_load(path, catalog_builtin()); });
  EXPECT_GT(e.where().line, 0);
  EXPECT_NE(e.message().find("malformed YAML"), std::string::npos);
}

TEST(SpecErrors, UnknownDeviceTypeSuggestsNearest) {
  TempDir dir;
  std::string path = dir.write("c.yaml", replace(kGoodCluster, "a100-80gb-sxm", "a100-80gb-sx"));
  Error e = expect_error([&] { cluster_load(path, catalog_builtin()); });
  EXPECT_EQ(e.where().field, "nodes[0].device");
  EXPECT_EQ(e.where().line, 4);
  EXPECT_NE(e.hint().find("a100-80gb-sxm"), std::string::npos) << e.format();
}

TEST(SpecErrors, UnknownModelTypeSuggestsNearest) {
  TempDir dir;
  std::string path = dir.write("m.json", replace(kGoodLlama, "\"llama\"", "\"lama\""));
  Error e = expect_error([&] { model_load_file(path); });
  EXPECT_EQ(e.where().field, "model_type");
  EXPECT_NE(e.hint().find("llama"), std::string::npos);
}

TEST(SpecErrors, HiddenNotDivisibleByHeads) {
  TempDir dir;
  std::string path = dir.write("m.json", replace(kGoodLlama, "\"num_attention_heads\": 8", "\"num_attention_heads\": 7"));
  Error e = expect_error([&] { model_load_file(path); });
  EXPECT_EQ(e.where().field, "num_attention_heads");
  EXPECT_NE(e.message().find("not divisible"), std::string::npos);
}

TEST(SpecErrors, KvHeadsMustDivideHeads) {
  TempDir dir;
  std::string path = dir.write("m.json", replace(kGoodLlama, "\"num_key_value_heads\": 4", "\"num_key_value_heads\": 3"));
  Error e = expect_error([&] { model_load_file(path); });
  EXPECT_EQ(e.where().field, "num_key_value_heads");
}

TEST(SpecErrors, ZeroAndNegativeCounts) {
  TempDir dir;
  Error layers = expect_error([&] {
    model_load_file(dir.write("a.json", replace(kGoodLlama, "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 0")));
  });
  EXPECT_EQ(layers.where().field, "num_hidden_layers");
  EXPECT_NE(layers.message().find("positive"), std::string::npos);
  Error nodes = expect_error([&] {
    cluster_load(dir.write("b.yaml", replace(kGoodCluster, "count: 2", "count: -1")), catalog_builtin());
  });
  EXPECT_EQ(nodes.where().field, "nodes[0].count");
}

TEST(SpecErrors, NegativeMemory) {
  TempDir dir;
  Error e = expect_error([&] {
    cluster_load(dir.write("c.yaml", replace(kGoodCluster, "host_memory: 1TiB", "host_memory: -1TiB")), catalog_builtin());
  });
  EXPECT_EQ(e.where().field, "nodes[0].host_memory");
  EXPECT_NE(e.message().find("non-negative"), std::string::npos);
}

TEST(SpecErrors, MissingRequiredField) {
  TempDir dir;
  Error e = expect_error([&] {
    model_load_file(dir.write("m.json", replace(kGoodLlama, "\"intermediate_size\": 512,", "")));
  });
  EXPECT_EQ(e.where().field, "intermediate_size");
  EXPECT_NE(e.message().find("missing"), std::string::npos);
}

TEST(SpecErrors, TypoInFieldNameIsCaught) {
  TempDir dir;
  Error e = expect_error([&] {
    cluster_load(dir.write("c.yaml", replace(kGoodCluster, "devices_per_node", "device_per_node")), catalog_builtin());
  });
  EXPECT_NE(e.hint().find("devices_per_node"), std::string::npos) << e.format();
}

TEST(SpecErrors, MultiNodeClusterNeedsNetwork) {
  TempDir dir;
  Error e = expect_error([&] {
    cluster_load(dir.write("c.yaml", replace(kGoodCluster, "network: {kind: infiniband, bandwidth: 200Gb/s, latency: 5us}\n", "")),
                 catalog_builtin());
  });
  EXPECT_EQ(e.where().field, "network");
}

TEST(SpecErrors, TrainBatchTokensMustDivide) {
  TempDir dir;
  Error e = expect_error([&] { train_load(dir.write("t.yaml", "seq_len: 2048\nglobal_batch_tokens: 1000\n")); });
  EXPECT_EQ(e.where().field, "global_batch_tokens");
}

TEST(SpecErrors, TrainNumbersOutOfRangeNameTheirField) {
  TempDir dir;
  const std::pair<const char*, const char*> cases[] = {
      {"seed: -1\n", "seed"},           {"weight_decay: .nan\n", "weight_decay"}, {"grad_clip: .inf\n", "grad_clip"},
      {"adam_eps: .inf\n", "adam_eps"}, {"grad_clip: -1\n", "grad_clip"},
  };
  for (const auto& [text, field] : cases) {
    Error e = expect_error([&] { train_load(dir.write("t.yaml", std::string("seq_len: 64\nglobal_batch: 8\n") + text)); });
    EXPECT_EQ(e.where().field, field) << text << e.format();
  }
}

TEST(SpecErrors, AKeyGivenTwiceIsRefusedNotOneValueDropped) {
  TempDir dir;
  Error yaml = expect_error([&] { train_load(dir.write("t.yaml", "seq_len: 64\nsteps: 200\nglobal_batch: 8\nsteps: 7\n")); });
  EXPECT_EQ(yaml.where().field, "steps");
  EXPECT_EQ(yaml.where().line, 4) << yaml.format();
  EXPECT_NE(yaml.message().find("first on line 2"), std::string::npos) << yaml.format();
  Error nested = expect_error([&] {
    cluster_load(dir.write("c.yaml", replace(kGoodCluster, "bandwidth: 200Gb/s,", "bandwidth: 200Gb/s, bandwidth: 100Gb/s,")),
                 catalog_builtin());
  });
  EXPECT_EQ(nested.where().field, "bandwidth") << nested.format();
  Error json = expect_error([&] { model_load(dir.write("m.json", R"({"model_type": "gpt2", "n_layer": 2, "n_layer": 4})")); });
  EXPECT_EQ(json.where().field, "n_layer") << json.format();
}

TEST(SpecErrors, FormatIsOneOrTwoLines) {
  TempDir dir;
  std::string path = dir.write("c.yaml", replace(kGoodCluster, "a100-80gb-sxm", "tpu-v9"));
  Error e = expect_error([&] { cluster_load(path, catalog_builtin()); });
  std::string text = e.format();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
  EXPECT_EQ(text.rfind(path, 0), 0u) << text;
}

}  // namespace
}  // namespace alloy
