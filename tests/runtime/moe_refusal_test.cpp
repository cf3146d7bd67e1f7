// The runtime refuses Mixture-of-Experts models: building one, importing or exporting its
// Hugging Face weights would drop its experts.
#include <gtest/gtest.h>

#include <functional>

#include "runtime/io/hf_weights.hpp"
#include "runtime/model.hpp"
#include "spec/error.hpp"

namespace alloy {
namespace {

void expect_moe_refusal(const std::function<void()>& consume, const std::string& consumer) {
  try {
    consume();
    ADD_FAILURE() << "expected an error from " << consumer;
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("Mixture-of-Experts models (model tiny-moe"), std::string::npos) << e.format();
    EXPECT_NE(e.message().find(consumer), std::string::npos) << e.format();
  }
}

TEST(MoeRuntime, ModelAndHuggingFaceConversionRefuseMoe) {
  const ModelSpec moe = model_load("tiny-moe");
  Arena arena(int64_t{1} << 24, "host");
  expect_moe_refusal([&] { Model model(moe, arena); }, "the runtime's model");
  expect_moe_refusal([&] { hf_weights_import(moe, "/nonexistent/model.safetensors"); }, "Hugging Face weight import");
  expect_moe_refusal([&] { hf_weights_export(moe, {}); }, "Hugging Face weight export");
  expect_moe_refusal([&] { hf_config_json(moe); }, "Hugging Face config export");
}

}  // namespace
}  // namespace alloy
