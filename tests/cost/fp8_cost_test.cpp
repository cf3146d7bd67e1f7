// fp8 runs as Transformer Engine and torchao's float8 training run them: the blocks' linear
// layers multiply in fp8, the attention core and the output layer at 16 bits, every tensor stays
// bf16, and each product pays for casting its input and weight.
#include <gtest/gtest.h>

#include "../support/specs.hpp"
#include "cost/cost_model.hpp"
#include "cost/runtime_traits.hpp"
#include "hw/catalog.hpp"

namespace alloy::fp8_cost_test {

constexpr Precision kFp8 = Precision::Precision_fp8;
constexpr Precision kBf16 = Precision::Precision_bf16;

// Llama 3.1 8B: hidden 4096, 32 query heads of 128, 8 key/value heads, MLP 14336.
ModelSpec llama3_8b() { return testing::llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256); }

TEST(Fp8Run, TensorsStayBf16) {
  EXPECT_EQ(precision_bytes(kFp8), precision_bytes(kBf16));
  const ModelSpec m = llama3_8b();
  EXPECT_DOUBLE_EQ(block_activation_bytes(m, 2, 8192, 1, false, Recompute::Recompute_none, kFp8),
                   block_activation_bytes(m, 2, 8192, 1, false, Recompute::Recompute_none, kBf16));
}

TEST(Fp8Run, CastsEachProductsInputAndWeight) {
  const ModelSpec m = llama3_8b();
  const double tokens = 2.0 * 8192;
  // Inputs per token: q, k, v and gate, up read the hidden state (5 x 4096), the output
  // projection the query width (4096), the down projection the MLP width (14336).
  const double inputs = 5.0 * 4096 + 4096 + 14336;
  const double weights = 4096.0 * 4096 + 2.0 * 4096 * 1024 + 4096.0 * 4096 + 3.0 * 4096 * 14336;
  EXPECT_DOUBLE_EQ(fp8_cast_bytes(m, 2, 8192, 1), 3.0 * (tokens * inputs + weights));
  const LayerWork fp8 = block_work(m, 2, 8192, 1, false, kFp8), bf16 = block_work(m, 2, 8192, 1, false, kBf16);
  EXPECT_DOUBLE_EQ(fp8.forward_elementwise_bytes - bf16.forward_elementwise_bytes, fp8_cast_bytes(m, 2, 8192, 1));
  EXPECT_DOUBLE_EQ(fp8.forward_flops, bf16.forward_flops);
  // The attention core's FLOPs stay 16-bit: Q K^T and scores x V.
  EXPECT_DOUBLE_EQ(fp8.sixteen_bit_forward_flops, 4.0 * tokens * 8192 * 4096);
  EXPECT_DOUBLE_EQ(head_work(m, 2, 8192, 1, kFp8).sixteen_bit_forward_flops, head_work(m, 2, 8192, 1, kFp8).forward_flops);
}

TEST(Fp8Run, LinearLayersAtTheFp8RateTheRestAt16Bits) {
  const DeviceType h100 = *catalog_builtin().find("h100-sxm");
  ASSERT_GT(h100.peak_flops(kFp8), 1.9 * h100.peak_flops(kBf16));
  LayerWork w;
  w.forward_flops = 1e12;
  w.sixteen_bit_forward_flops = 2e11;
  w.backward_flops = 2e12;
  w.matmul_rows = w.matmul_cols = 4096;
  const auto rate = [&](Precision p) { return h100.peak_flops(p) * compute_efficiency(h100, p, 4096, 4096); };
  EXPECT_DOUBLE_EQ(compute_seconds(h100, kFp8, w, false), 8e11 / rate(kFp8) + 2e11 / rate(kBf16));
  EXPECT_DOUBLE_EQ(compute_seconds(h100, kFp8, w, true), 1.6e12 / rate(kFp8) + 4e11 / rate(kBf16));
  // Its own calibrated share of the fp8 peak.
  EXPECT_DOUBLE_EQ(matmul_peak_share(h100, kFp8), h100.matmul_efficiency_fp8);
  EXPECT_NE(h100.matmul_efficiency_fp8, h100.matmul_efficiency);
  // A device without fp8 runs the whole pass at 16 bits.
  const DeviceType a100 = *catalog_builtin().find("a100-80gb-sxm");
  EXPECT_DOUBLE_EQ(compute_seconds(a100, kFp8, w, false), compute_seconds(a100, kBf16, w, false));
}

// Transformer Engine (Megatron-LM) casts the weights on a step's first micro-batch only: each
// micro-batch casts its inputs, and the step casts every block's weights once, with the optimizer.
TEST(Fp8Run, TransformerEngineCastsWeightsOncePerStep) {
  const ModelSpec m = llama3_8b();
  const double tokens = 2.0 * 8192;
  const double inputs = 5.0 * 4096 + 4096 + 14336;
  const double weights = 4096.0 * 4096 + 2.0 * 4096 * 1024 + 4096.0 * 4096 + 3.0 * 4096 * 14336;
  constexpr Fp8WeightCasts kOnce = Fp8WeightCasts::Fp8WeightCasts_once_per_step;
  EXPECT_DOUBLE_EQ(fp8_cast_bytes(m, 2, 8192, 1, kOnce), 3.0 * tokens * inputs);
  EXPECT_DOUBLE_EQ(fp8_weight_cast_bytes_per_step(m, 2), 4.0 * weights / 2);
  EXPECT_EQ(framework_runtime_traits("megatron-lm")->fp8_weight_casts, kOnce);
  EXPECT_EQ(framework_runtime_traits("torchtitan-compile")->fp8_weight_casts,
            Fp8WeightCasts::Fp8WeightCasts_every_micro_batch);

  const auto priced = [&](const std::string& framework) {
    const CostModel cost(m, testing::catalog_cluster("h100-sxm", framework, 1), testing::train(8192, 2, kFp8));
    const StageShape shape = cost.stage_shape({0}, 1, 1, 2);
    const StageUnitCosts u = cost.unit_costs(shape, false);
    StageChoice c;
    c.blocks = 4;
    return std::pair{u, cost.stage_timing(shape, u, c, 0, 0)};
  };
  const auto [megatron, megatron_step] = priced("megatron-lm");
  const auto [compiled, compiled_step] = priced("torchtitan-compile");
  EXPECT_LT(megatron.block.forward_seconds, compiled.block.forward_seconds);
  EXPECT_GT(megatron.fp8_weight_cast_seconds, 0);
  EXPECT_DOUBLE_EQ(compiled.fp8_weight_cast_seconds, 0);
  // The two records differ in nothing else the optimizer step is priced by.
  EXPECT_NEAR(megatron_step.optimizer_seconds - compiled_step.optimizer_seconds, 4 * megatron.fp8_weight_cast_seconds,
              1e-12);
}

// A stage on a device without fp8 (an A100) runs an fp8 plan's blocks as a bf16 plan's: no casts.
TEST(Fp8Run, ADeviceWithoutFp8PaysNoCasts) {
  const ModelSpec m = llama3_8b();
  const auto block_seconds = [&](const char* device, Precision precision) {
    const CostModel cost(m, testing::catalog_cluster(device, "", 1), testing::train(8192, 2, precision));
    const StageUnitCosts u = cost.unit_costs(cost.stage_shape({0}, 1, 1, 2), false);
    return u.block.forward_seconds + u.block.backward_seconds;
  };
  EXPECT_DOUBLE_EQ(block_seconds("a100-80gb-sxm", kFp8), block_seconds("a100-80gb-sxm", kBf16));
  EXPECT_LT(block_seconds("h100-sxm", kFp8), 0.8 * block_seconds("h100-sxm", kBf16));
}

}  // namespace alloy::fp8_cost_test
