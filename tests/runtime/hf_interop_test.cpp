// Hugging Face weights in and out, on the fixtures of scripts/hf_fixtures.py (tiny GPT-2 as
// transformers saves it, "transformer." prefix and Conv1D matrices; tiny LLaMA in two shards with
// an index): imported, Alloy's forward gives the logits of an independent float64 PyTorch
// implementation of the Hugging Face models; exported, the files hold the same tensors under the
// same names; weights of another model are refused naming the tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "../common/test_util.hpp"
#include "runtime/arena.hpp"
#include "runtime/io/checkpoint_commit.hpp"
#include "runtime/io/safetensors.hpp"
#include "runtime/model.hpp"
#include "runtime/threads.hpp"
#include "spec/model.hpp"

namespace alloy {
namespace {

using testing::alloy;
using testing::CommandResult;
using testing::TempDir;

const std::string kFixtures = std::string(ALLOY_SOURCE_DIR) + "/tests/io/hf/";

std::vector<float> floats_of(const SafetensorsFile& file, const std::string& name) {
  const SafetensorsEntry* e = file.entry_find(name);
  if (e == nullptr) return {};
  std::vector<float> out(static_cast<size_t>(safetensors_entry_numel(*e)));
  file.entry_copy(*e, out.data());
  return out;
}

// Every tensor of the Hugging Face files at `path` (a .safetensors or an index), by name
// without the "transformer." prefix.
std::map<std::string, std::vector<float>> hf_tensors(const std::string& folder) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& entry : std::filesystem::directory_iterator(folder)) {
    const std::string path = entry.path().string();
    if (!path.ends_with(".safetensors") || path.ends_with("reference.safetensors")) continue;
    const SafetensorsFile file = safetensors_open(path);
    for (const SafetensorsEntry& e : file.entries()) {
      std::string name = e.name;
      if (name.rfind("transformer.", 0) == 0) name = name.substr(12);
      out[name] = floats_of(file, e.name);
    }
  }
  return out;
}

class HfInterop : public ::testing::TestWithParam<std::pair<const char*, const char*>> {};

TEST_P(HfInterop, ImportedWeightsGiveTheReferenceLogitsAndExportGivesThemBack) {
  const auto [name, weights_file] = GetParam();
  const std::string folder = kFixtures + name;
  TempDir dir;
  const std::string ck = dir.path() + "/imported";
  const CommandResult imported = alloy(fmt::format("import-hf {}/{} {}/config.json -o {}", folder, weights_file, folder, ck));
  ASSERT_EQ(imported.exit_code, 0) << imported.output;

  // Alloy's forward on the imported tensors against the reference logits.
  runtime_set_threads(1);
  const ModelSpec spec = model_load(folder + "/config.json");
  Arena arena(int64_t{1} << 28);
  Model model(spec, arena);
  std::vector<TensorRef> refs;
  for (const TensorView& v : model.views) refs.push_back({v.name, v.shape, model.params + v.offset});
  safetensors_read_into(safetensors_open(checkpoint_rank_dir(ck, 0, 0) + "/model.safetensors"), refs);
  const SafetensorsFile reference = safetensors_open(folder + "/reference.safetensors");
  const std::vector<float> token_values = floats_of(reference, "tokens");  // ids, exact in F32
  ASSERT_FALSE(token_values.empty());
  const int T = static_cast<int>(token_values.size());
  std::vector<int32_t> tokens(token_values.begin(), token_values.end());
  const std::vector<int32_t> targets(static_cast<size_t>(T), 0);
  model_forward(model, tokens.data(), targets.data(), 1, T);
  const std::vector<float> want = floats_of(reference, "logits");
  ASSERT_EQ(want.size(), static_cast<size_t>(T * spec.vocab_size));
  double largest = 0, worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    largest = std::max(largest, std::fabs(static_cast<double>(want[i])));
    worst = std::max(worst, std::fabs(static_cast<double>(model.pass.head.logits[i]) - want[i]));
  }
  std::printf("%s: largest logit difference from PyTorch %.2e (of %.3f)\n", name, worst, largest);
  EXPECT_LT(worst, 1e-4 * largest) << name;

  // Exported (in shards of at most 100 KB here), the same tensors under the same names.
  const std::string out = dir.path() + "/exported";
  const CommandResult exported = alloy(fmt::format("export-hf {} -o {} --shard-size 100KB", ck, out));
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_TRUE(std::filesystem::exists(out + "/model.safetensors.index.json")) << exported.output;
  const auto original = hf_tensors(folder), written = hf_tensors(out);
  EXPECT_EQ(written.size(), original.size());
  for (const auto& [tensor, values] : original) {
    ASSERT_TRUE(written.count(tensor)) << tensor;
    EXPECT_EQ(written.at(tensor), values) << tensor;
  }
  // Its config.json describes the same model, and its index imports again.
  EXPECT_EQ(model_fingerprint(model_load(out + "/config.json")), model_fingerprint(spec));
  const CommandResult again = alloy(fmt::format("import-hf {}/model.safetensors.index.json {}/config.json -o {}/again",
                                                out, out, dir.path()));
  EXPECT_EQ(again.exit_code, 0) << again.output;
}

INSTANTIATE_TEST_SUITE_P(Families, HfInterop,
                         ::testing::Values(std::pair{"tiny_gpt2", "model.safetensors"},
                                           std::pair{"tiny_llama", "model.safetensors.index.json"}));

TEST(HfInteropRefusals, WeightsOfAnotherModelAreNamed) {
  TempDir dir;
  // GPT-2 weights under the LLaMA config: the first tensor the config needs is missing.
  const CommandResult swapped = alloy(fmt::format("import-hf {}tiny_gpt2/model.safetensors {}tiny_llama/config.json -o {}/a",
                                                  kFixtures, kFixtures, dir.path()));
  EXPECT_EQ(swapped.exit_code, 2) << swapped.output;
  EXPECT_NE(swapped.output.find("model.embed_tokens.weight"), std::string::npos) << swapped.output;
  // A config one layer short: a tensor of the weights has no place.
  std::string config = testing::read_text(kFixtures + "tiny_llama/config.json");
  config.replace(config.find("\"num_hidden_layers\": 2"), 22, "\"num_hidden_layers\": 1");
  std::filesystem::create_directories(dir.path() + "/short");
  const std::string shorter = dir.write("short/config.json", config);
  const CommandResult short_config = alloy(fmt::format("import-hf {}tiny_llama/model.safetensors.index.json {} -o {}/b",
                                                       kFixtures, shorter, dir.path()));
  EXPECT_EQ(short_config.exit_code, 2) << short_config.output;
  EXPECT_NE(short_config.output.find("model.layers.1."), std::string::npos) << short_config.output;
  EXPECT_NE(short_config.output.find("has no place"), std::string::npos) << short_config.output;
}

}  // namespace
}  // namespace alloy
