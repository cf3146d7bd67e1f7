// A load-balancing loss over each sequence's routing (DeepSeek's seq_aux) is refused when the
// model is built, naming the field, instead of training another objective.
#include <gtest/gtest.h>

#include "runtime/arena.hpp"
#include "runtime/model.hpp"
#include "spec/error.hpp"
#include "spec/model.hpp"

namespace alloy {
namespace {

TEST(MoeSequenceAux, IsRefusedByFieldWhenItWeighsAnything) {
  ModelSpec spec = model_load("tiny-moe");
  spec.moe.aux_per_sequence = true;
  Arena arena(int64_t{1} << 26, "host");
  try {
    Model model(spec, arena);
    FAIL() << "a per-sequence balance loss was built";
  } catch (const Error& e) {
    EXPECT_EQ(e.where().field, "moe.aux_per_sequence") << e.format();
    EXPECT_NE(e.message().find("seq_aux"), std::string::npos) << e.format();
  }
  spec.moe.router_aux_loss_coef = 0;  // nothing to balance: the statistics do not matter
  Arena free_arena(int64_t{1} << 26, "host");
  EXPECT_NO_THROW(Model(spec, free_arena));
}

}  // namespace
}  // namespace alloy
