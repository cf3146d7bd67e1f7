// A training file's measured MoE routing (expert_tokens): read, written back, bad values refused.
#include <gtest/gtest.h>

#include "spec/error.hpp"
#include "spec/train.hpp"

namespace alloy {
namespace {

TEST(TrainExpertTokens, ReadAndWrittenBack) {
  const TrainSpec t = train_load_text("seq_len: 32\nglobal_batch: 4\nexpert_tokens: [10, 30, 0, 60]\n", "t.yaml");
  EXPECT_EQ(t.expert_tokens, (std::vector<double>{10, 30, 0, 60}));
  EXPECT_EQ(train_load_text(train_to_yaml(t), "u.yaml").expert_tokens, t.expert_tokens);
  EXPECT_TRUE(train_load_text("seq_len: 32\n", "v.yaml").expert_tokens.empty());
  EXPECT_EQ(train_to_yaml(train_load_text("seq_len: 32\n", "v.yaml")).find("expert_tokens"), std::string::npos);
}

TEST(TrainExpertTokens, BadValuesNameTheField) {
  for (const char* bad : {"expert_tokens: [1, -2]", "expert_tokens: 5", "expert_tokens: [0, 0]", "expert_tokens: [a]"}) {
    try {
      train_load_text(std::string("seq_len: 32\n") + bad + "\n", "t.yaml");
      FAIL() << bad;
    } catch (const Error& e) {
      EXPECT_NE(e.format().find("expert_tokens"), std::string::npos) << bad << ": " << e.format();
    }
  }
}

}  // namespace
}  // namespace alloy
