// The runtime traits of another framework (torchtitan's Llama trainer): its op-level selective
// checkpointing, eager element-wise traffic and fp32 loss copy against hand counts for a Llama 3
// 8B block, and Alloy's GPU runtime left as it was.
#include <gtest/gtest.h>

#include "../support/specs.hpp"
#include "cost/comm.hpp"
#include "cost/cost_model.hpp"
#include "cost/runtime_traits.hpp"
#include "hw/catalog.hpp"
#include "spec/error.hpp"

namespace alloy {
namespace {

// Llama 3.1 8B: hidden 4096, 32 query heads of 128, 8 key/value heads, MLP 14336.
ModelSpec llama3_8b() { return testing::llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256); }

constexpr double kTokens = 2.0 * 8192.0;  // micro-batch 2 of 8192 tokens
constexpr Precision kBf16 = Precision::Precision_bf16;
constexpr Precision kFp8 = Precision::Precision_fp8;

TEST(FrameworkTraits, AlternateMatmulsKeepTheOddProductsAndTheAttentionOutput) {
  const ModelSpec m = llama3_8b();
  const double kept = block_activation_bytes(m, 2, 8192, 1, false, Recompute::Recompute_selective, kBf16,
                                             AttentionMemory::AttentionMemory_fused,
                                             SelectiveRecompute::SelectiveRecompute_alternate_matmuls);
  // Block input 4096; q 4096 (1st), v 1024 (3rd), gate 14336 (5th), down 4096 (7th); attention
  // output 4096: bf16. Log-sum-exp: 32 heads in fp32.
  const double by_hand = kTokens * (4096.0 + 4096 + 1024 + 14336 + 4096 + 4096) * 2 + kTokens * 32 * 4;
  EXPECT_DOUBLE_EQ(kept, by_hand);
  // Less than half of what Alloy's selective recomputation keeps.
  const double alloy = block_activation_bytes(m, 2, 8192, 1, false, Recompute::Recompute_selective, kBf16,
                                              AttentionMemory::AttentionMemory_fused);
  EXPECT_LT(kept, 0.5 * alloy);
}

TEST(FrameworkTraits, AlternateMatmulsRecomputeTheEvenProducts) {
  const ModelSpec m = llama3_8b();
  const LayerWork w = block_work(m, 2, 8192, 1, false, kBf16, ElementwiseKernels::ElementwiseKernels_eager,
                                 SelectiveRecompute::SelectiveRecompute_alternate_matmuls);
  // k (4096 -> 1024), output (4096 -> 4096), up (4096 -> 14336).
  const double by_hand = 2.0 * kTokens * (4096.0 * 1024 + 4096.0 * 4096 + 4096.0 * 14336);
  EXPECT_DOUBLE_EQ(w.selective_flops, by_hand);
  const LayerWork again = alternate_matmuls_recompute_work(w);
  EXPECT_DOUBLE_EQ(again.forward_flops, by_hand);
  EXPECT_DOUBLE_EQ(again.forward_elementwise_bytes, w.forward_elementwise_bytes - w.forward_score_bytes);
  // Under tp 2 each rank recomputes half.
  const LayerWork half = block_work(m, 2, 8192, 2, false, kBf16, ElementwiseKernels::ElementwiseKernels_eager,
                                    SelectiveRecompute::SelectiveRecompute_alternate_matmuls);
  EXPECT_DOUBLE_EQ(half.selective_flops, by_hand / 2);
}

TEST(FrameworkTraits, EagerKernelsMoveEachOperationsBytes) {
  const ModelSpec m = llama3_8b();
  // bf16: 98 x hidden + 36 x query + 28 x key/value + 16 x MLP width (layer_cost.hpp's count).
  const double by_hand = 98.0 * 4096 + 36.0 * 4096 + 28.0 * 1024 + 16.0 * 14336;
  EXPECT_DOUBLE_EQ(eager_block_elementwise_bytes_per_token(m, 1, false, kBf16), by_hand);
  const LayerWork fused = block_work(m, 2, 8192, 1, false, kBf16);
  const LayerWork eager = block_work(m, 2, 8192, 1, false, kBf16, ElementwiseKernels::ElementwiseKernels_eager);
  EXPECT_DOUBLE_EQ(eager.forward_elementwise_bytes - eager.forward_score_bytes, kTokens * by_hand);
  EXPECT_GT(eager.forward_elementwise_bytes, 3.0 * fused.forward_elementwise_bytes - 3.0 * fused.forward_score_bytes);
  EXPECT_DOUBLE_EQ(eager.forward_flops, fused.forward_flops);
}

TEST(FrameworkTraits, Fp32LossCopyKeepsLogProbabilitiesAndHoldsTheirGradients) {
  const ModelSpec m = llama3_8b();
  const double vocab = 128256;
  const double kept = head_activation_bytes(m, 2, 8192, 1, kBf16, AttentionMemory::AttentionMemory_fused,
                                            LossLogits::LossLogits_fp32_copy);
  EXPECT_DOUBLE_EQ(kept, kTokens * 4096 * 2 + kTokens * 4 + kTokens * vocab * 4);
  EXPECT_DOUBLE_EQ(head_backward_workspace_bytes(m, 2, 8192, 1, LossLogits::LossLogits_fp32_copy), 2 * kTokens * vocab * 4);
  EXPECT_DOUBLE_EQ(head_backward_workspace_bytes(m, 2, 8192, 1, LossLogits::LossLogits_runtime_kernel), 0);
  // Over a vocabulary split 8 ways, loss parallelism's backward holds a third fp32 copy.
  EXPECT_DOUBLE_EQ(head_backward_workspace_bytes(m, 16, 8192, 8, LossLogits::LossLogits_fp32_copy),
                   3 * 8 * kTokens * vocab * 4 / 8);
}

TEST(FrameworkTraits, RecordsByNameAndAlloysRuntimeByDefault) {
  DeviceType h100 = *catalog_builtin().find("h100-sxm");
  const RuntimeTraits& gpu = runtime_traits(h100);
  EXPECT_EQ(gpu.elementwise_kernels, ElementwiseKernels::ElementwiseKernels_fused);
  EXPECT_EQ(gpu.selective_recompute, SelectiveRecompute::SelectiveRecompute_attention_core);
  EXPECT_EQ(gpu.loss_logits, LossLogits::LossLogits_runtime_kernel);

  h100.framework = "torchtitan-eager";
  const RuntimeTraits& eager = runtime_traits(h100);
  EXPECT_EQ(&eager, framework_runtime_traits("torchtitan-eager"));
  EXPECT_EQ(eager.elementwise_kernels, ElementwiseKernels::ElementwiseKernels_eager);
  EXPECT_EQ(eager.selective_recompute, SelectiveRecompute::SelectiveRecompute_alternate_matmuls);
  EXPECT_EQ(eager.loss_logits, LossLogits::LossLogits_fp32_copy);
  // Everything else is the GPU runtime's.
  EXPECT_DOUBLE_EQ(eager.matmul_half_rows, gpu.matmul_half_rows);
  EXPECT_DOUBLE_EQ(eager.library_workspace_bytes, gpu.library_workspace_bytes);
  EXPECT_EQ(framework_runtime_traits("torchtitan-compile")->elementwise_kernels, ElementwiseKernels::ElementwiseKernels_fused);

  // Megatron-LM's distributed optimizer shards the fp32 master weights; its kernels are priced
  // as the GPU runtime's.
  const RuntimeTraits* megatron = framework_runtime_traits("megatron-lm");
  ASSERT_NE(megatron, nullptr);
  EXPECT_TRUE(megatron->zero_shards_master_weights);
  EXPECT_TRUE(megatron->pipeline_sends_sequence_shards);
  EXPECT_FALSE(gpu.pipeline_sends_sequence_shards);
  EXPECT_FALSE(gpu.zero_shards_master_weights);
  EXPECT_EQ(megatron->elementwise_kernels, gpu.elementwise_kernels);
  EXPECT_DOUBLE_EQ(megatron->allocator_margin_fraction, gpu.allocator_margin_fraction);

  h100.framework = "megatron";
  EXPECT_EQ(framework_runtime_traits("megatron"), nullptr);
  EXPECT_THROW(runtime_traits(h100), Error);
}

// A Llama 3 8B stage on one H100 priced as torchtitan runs it: eager blocks take longer than the
// compiled ones, and its selective level keeps less than Alloy's.
TEST(FrameworkTraits, CostModelAsksTheFrameworksRecord) {
  const ModelSpec m = llama3_8b();
  const auto unit = [&](const std::string& framework) {
    const CostModel cost(m, testing::catalog_cluster("h100-sxm", framework, 1), testing::train(8192, 2));
    return cost.unit_costs(cost.stage_shape({0}, 1, 1, 2), false);
  };
  const StageUnitCosts alloy = unit(""), eager = unit("torchtitan-eager"), compiled = unit("torchtitan-compile");
  EXPECT_GT(eager.block.forward_seconds, 1.1 * compiled.block.forward_seconds);
  EXPECT_DOUBLE_EQ(compiled.block.forward_seconds, alloy.block.forward_seconds);
  EXPECT_LT(eager.block_activation_bytes[1], 0.5 * alloy.block_activation_bytes[1]);
  EXPECT_GT(eager.recompute_selective_seconds, alloy.recompute_selective_seconds);
  EXPECT_GT(eager.head_backward_workspace_bytes, 0);
  EXPECT_DOUBLE_EQ(alloy.head_backward_workspace_bytes, 0);
}

// A boundary's hidden state crosses once per tp rank of the receiving stage as Alloy's runtimes
// send it, once in all when each rank sends its sequence shard (Megatron Core).
TEST(FrameworkTraits, SequenceShardsCrossABoundaryOnce) {
  EXPECT_DOUBLE_EQ(boundary_transfer_bytes(64.0, 4), 256.0);
  EXPECT_DOUBLE_EQ(boundary_transfer_bytes(64.0, 4, true), 64.0);
  BoundaryLink link;
  link.network.bandwidth_bytes_per_second = 50e9;
  link.aggregate_network_bytes_per_second = 50e9;
  EXPECT_DOUBLE_EQ(boundary_transfer_seconds(1e9, link, 4, 4, true), boundary_transfer_seconds(1e9, link, 1, 1));
  EXPECT_GT(boundary_transfer_seconds(1e9, link, 4, 4), 3.9 * boundary_transfer_seconds(1e9, link, 4, 4, true));
}

// FSDP under PyTorch's pipeline schedules keeps a stage's weights gathered for the whole step:
// it holds them all in bf16 and gathers them once, in the step's first forward. Alloy's runtime
// gathers a block for each pass and holds two at a time. Unpipelined, both gather per pass.
TEST(FrameworkTraits, PipelinedFsdpGathersOnceAStep) {
  const ModelSpec m = llama3_8b();
  struct Priced {
    MemoryBreakdown memory;
    StageTiming timing;
    double block_parameters = 0;
  };
  const auto priced = [&](const std::string& framework, bool pipelined) {
    const CostModel cost(m, testing::catalog_cluster("h100-sxm", framework, 8), testing::train(8192, 32));
    const StageShape shape = cost.stage_shape({0, 1, 2, 3}, 1, 4, 1);
    const StageUnitCosts u = cost.unit_costs(shape, false);
    StageChoice c;
    c.blocks = 8;
    c.zero = 3;
    c.micro_batches = 8;
    c.chunks_sent = pipelined ? 1 : 0;
    return Priced{cost.stage_memory(shape, u, c, 1, pipelined), cost.stage_timing(shape, u, c, 0, c.chunks_sent),
                  u.block_parameters};
  };
  const Priced torch = priced("torchtitan-compile", true), alloy = priced("", true);
  const Priced torch_alone = priced("torchtitan-compile", false);
  EXPECT_DOUBLE_EQ(torch.memory.zero3_gather_bytes, 8 * torch.block_parameters * 2);
  EXPECT_DOUBLE_EQ(alloy.memory.zero3_gather_bytes, 2 * alloy.block_parameters * 2);
  EXPECT_DOUBLE_EQ(torch_alone.memory.zero3_gather_bytes, alloy.memory.zero3_gather_bytes);
  // The gathers leave the backward and an eighth of the forward's stays, per micro-batch.
  EXPECT_LT(torch.timing.backward_seconds, torch_alone.timing.backward_seconds);
  EXPECT_LT(torch.timing.forward_seconds, torch_alone.timing.forward_seconds);
  EXPECT_GT(torch_alone.timing.forward_seconds - torch.timing.forward_seconds, 0.5 * torch_alone.timing.first_gather_forward_seconds);
}

// torchtitan's float8 tensor parallelism all-gathers fp8 copies: a block over tp 2 with sequence
// parallelism takes less time than Alloy's runtime's, which gathers bf16; at bf16 they are equal.
TEST(FrameworkTraits, Float8TensorParallelGathersInFp8) {
  const ModelSpec m = llama3_8b();
  const auto forward = [&](const std::string& framework, Precision precision) {
    const CostModel cost(m, testing::catalog_cluster("h100-sxm", framework, 2), testing::train(8192, 2, precision));
    return cost.unit_costs(cost.stage_shape({0, 1}, 2, 1, 1), true).block.forward_seconds;
  };
  EXPECT_TRUE(framework_runtime_traits("torchtitan-compile")->fp8_tensor_parallel_gathers);
  EXPECT_FALSE(framework_runtime_traits("megatron-lm")->fp8_tensor_parallel_gathers);
  EXPECT_LT(forward("torchtitan-compile", kFp8), forward("", kFp8));
  EXPECT_DOUBLE_EQ(forward("torchtitan-compile", kBf16), forward("", kBf16));
}

}  // namespace
}  // namespace alloy
