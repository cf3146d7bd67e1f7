// What a plan keeps of its inputs reads back as the same spec: every model preset through
// model_to_yaml, every shipped training file through train_to_yaml, every cluster preset from
// the text it was read from.
#include <gtest/gtest.h>

#include <filesystem>

#include "hw/catalog.hpp"
#include "plan/plan.hpp"
#include "spec/cluster.hpp"
#include "spec/model.hpp"
#include "spec/train.hpp"

namespace alloy {
namespace {

TEST(RoundTrip, EveryModelPresetThroughAlloyYaml) {
  const std::vector<std::string> presets = model_preset_names();
  ASSERT_GE(presets.size(), 10u);
  for (const std::string& name : presets) {
    const ModelSpec m = model_load(name);
    const std::string yaml = model_to_yaml(m);
    const ModelSpec back = model_load_text(yaml, "kept.yaml");
    EXPECT_EQ(model_to_yaml(back), yaml) << name;
    EXPECT_EQ(model_fingerprint(back), model_fingerprint(m)) << name;
    EXPECT_EQ(back.name, m.name);
    EXPECT_EQ(back.model_type, m.model_type) << name;
    EXPECT_EQ(back.norm_eps, m.norm_eps) << name;
    EXPECT_EQ(back.rope_theta, m.rope_theta) << name;
  }
  // Names that YAML would read as something else stay text.
  ModelSpec odd = model_load("tiny-gpt");
  odd.name = "yes: \"quoted\" \\ name\nover two lines\tand a tab";
  EXPECT_EQ(model_load_text(model_to_yaml(odd), "odd.yaml").name, odd.name);
}

TEST(RoundTrip, EveryShippedTrainingSetup) {
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(ALLOY_SOURCE_DIR) + "/examples/train")) {
    const TrainSpec t = train_load(entry.path().string());
    const std::string yaml = train_to_yaml(t);
    const TrainSpec back = train_load_text(yaml, "kept.yaml");
    EXPECT_EQ(train_to_yaml(back), yaml) << entry.path();
    EXPECT_EQ(back.seq_len, t.seq_len);
    EXPECT_EQ(back.global_batch_sequences, t.global_batch_sequences);
    EXPECT_EQ(back.learning_rate, t.learning_rate) << entry.path();
    EXPECT_EQ(back.seed, t.seed);
    ++files;
  }
  EXPECT_GE(files, 4);
  TrainSpec ranged;
  ranged.min_global_batch = 16;
  ranged.max_global_batch = 64;
  ranged.optimizer = "sgd";
  const TrainSpec back = train_load_text(train_to_yaml(ranged), "kept.yaml");
  EXPECT_EQ(back.min_global_batch, 16);
  EXPECT_EQ(back.max_global_batch, 64);
  EXPECT_EQ(back.optimizer, "sgd");
}

TEST(RoundTrip, EveryClusterPresetFromItsText) {
  const std::vector<std::string> presets = cluster_preset_names();
  ASSERT_GE(presets.size(), 10u);
  for (const std::string& name : presets) {
    const ClusterSpec c = cluster_load(name, catalog_builtin());
    ASSERT_FALSE(c.source_text.empty()) << name;
    const ClusterSpec back = cluster_load_text(c.source_text, "kept", name, catalog_builtin());
    EXPECT_EQ(cluster_fingerprint(back), cluster_fingerprint(c)) << name;
    EXPECT_EQ(back.name, c.name);
    EXPECT_EQ(back.devices.size(), c.devices.size());
  }
}

}  // namespace
}  // namespace alloy
