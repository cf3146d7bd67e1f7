// `alloy tokenize --tokenizer` as a user runs it: what it prints, uint16 or uint32 files by
// vocabulary, training on them, and bad tokenizers exiting 2 with a message.
#include <gtest/gtest.h>

#include "../common/test_util.hpp"

namespace alloy {
namespace {

using testing::CommandResult;
using testing::TempDir;

const std::string kBpeFixtures = std::string(ALLOY_SOURCE_DIR) + "/tests/io/bpe/";
const std::string kExampleText = std::string(ALLOY_SOURCE_DIR) + "/examples/data/fsf_licenses.txt";

TEST(TokenizeCli, BpeTokenizerPrintsWhatItWrote) {
  TempDir dir;
  CommandResult gpt2 = testing::alloy("tokenize " + kExampleText + " -o " + dir.path() + "/g.bin --tokenizer " +
                                      kBpeFixtures + "gpt2_tokenizer.json --val-fraction 0.1");
  ASSERT_EQ(gpt2.exit_code, 0) << gpt2.output;
  EXPECT_NE(gpt2.output.find(dir.path() + "/g_train.bin ("), std::string::npos) << gpt2.output;
  EXPECT_NE(gpt2.output.find("vocabulary 1258, uint16 tokens, version 1"), std::string::npos) << gpt2.output;
  EXPECT_NE(gpt2.output.find("MB/s"), std::string::npos) << gpt2.output;

  CommandResult llama = testing::alloy("tokenize " + kExampleText + " -o " + dir.path() + "/l.bin --tokenizer " +
                                       kBpeFixtures + "llama3_tokenizer.json");
  ASSERT_EQ(llama.exit_code, 0) << llama.output;
  EXPECT_NE(llama.output.find("vocabulary 128004, uint32 tokens, version 2"), std::string::npos) << llama.output;
}

// A uint32 file trains a model whose vocabulary covers it, and a smaller model refuses it
// naming the first token it cannot embed.
TEST(TokenizeCli, TrainingChecksBpeTokensAgainstTheModelVocabulary) {
  TempDir dir;
  CommandResult tok = testing::alloy("tokenize " + kExampleText + " -o " + dir.path() + "/l.bin --tokenizer " +
                                     kBpeFixtures + "llama3_tokenizer.json");
  ASSERT_EQ(tok.exit_code, 0) << tok.output;
  const std::string train = " --data " + dir.path() + "/l.bin --steps 1 --batch 2 --seq-len 16 --threads 1";
  CommandResult small = testing::alloy("train --model tiny-gpt" + train);
  EXPECT_EQ(small.exit_code, 2) << small.output;
  EXPECT_NE(small.output.find("is not below the model's vocabulary size 256"), std::string::npos) << small.output;

  std::string model = testing::read_text(std::string(ALLOY_SOURCE_DIR) + "/examples/models/tiny-gpt.yaml");
  model.replace(model.find("vocab_size: 256"), 15, "vocab_size: 128004");
  CommandResult large = testing::alloy("train --model " + dir.write("bpe-gpt.yaml", model) + train);
  EXPECT_EQ(large.exit_code, 0) << large.output;
}

TEST(TokenizeCli, BadTokenizerExitsTwoWithMessage) {
  TempDir dir;
  CommandResult missing = testing::alloy("tokenize " + kExampleText + " -o " + dir.path() + "/o.bin --tokenizer " +
                                         dir.path() + "/no.json");
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("tokenizer file not found"), std::string::npos) << missing.output;

  std::string word_piece = dir.write("wp.json", R"({"model": {"type": "WordPiece", "vocab": {}}})");
  CommandResult unsupported =
      testing::alloy("tokenize " + kExampleText + " -o " + dir.path() + "/o.bin --tokenizer " + word_piece);
  EXPECT_EQ(unsupported.exit_code, 2) << unsupported.output;
  EXPECT_NE(unsupported.output.find("model.type: model type \"WordPiece\" is not supported"), std::string::npos)
      << unsupported.output;
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/o.bin"));
}

}  // namespace
}  // namespace alloy
