// The cost model refuses Mixture-of-Experts models instead of pricing their experts as one dense MLP.
#include <gtest/gtest.h>

#include "cost/cost_model.hpp"
#include "hw/catalog.hpp"
#include "spec/error.hpp"

namespace alloy {
namespace {

TEST(MoeCostModel, RefusesMoeModels) {
  const ClusterSpec cluster = cluster_load("local-cpu-1", catalog_builtin());
  try {
    CostModel cost(model_load("tiny-moe"), cluster, TrainSpec{});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("Mixture-of-Experts models (model tiny-moe: 4 experts, 2 per token)"), std::string::npos)
        << e.format();
    EXPECT_NE(e.message().find("the cost model"), std::string::npos) << e.format();
  }
  EXPECT_NO_THROW(CostModel(model_load("tiny-llama"), cluster, TrainSpec{}));
}

}  // namespace
}  // namespace alloy
