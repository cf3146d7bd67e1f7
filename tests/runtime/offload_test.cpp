// The offload engines on one rank, without MPI: weights in host memory fetched into device slots
// and activations parked in host memory give exactly the gradients of the model that keeps
// everything on the device, with a lower arena peak; a use out of the planned order is refused.
#include <gtest/gtest.h>

#include <vector>

#include "../support/specs.hpp"
#include "runtime/activation_offload.hpp"
#include "runtime/model.hpp"
#include "runtime/offload.hpp"
#include "spec/error.hpp"

namespace alloy {
namespace {

ModelSpec four_block_gpt() { return testing::gpt2("four-block-gpt", 4, 64, 4, 256, 32); }

constexpr int kB = 2, kT = 16;

std::vector<int32_t> tokens(int salt) {
  std::vector<int32_t> t(kB * kT);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int32_t>((i * 31 + static_cast<size_t>(salt) * 7) % 256);
  return t;
}

// Two micro-batches accumulated into the gradients.
void two_micro_batches(Model& model) {
  for (int mb = 0; mb < 2; ++mb) {
    const std::vector<int32_t> in = tokens(mb), target = tokens(mb + 5);
    model_forward(model, in.data(), target.data(), kB, kT);
    model_backward(model, 0.5f);
  }
}

// Every parameter's gradient, in view order, wherever it lives.
std::vector<float> gradients(const Model& model) {
  std::vector<float> grads;
  for (const TensorView& v : model.views) {
    const float* g = model_gradients_at(model, v.offset, v.numel);
    grads.insert(grads.end(), g, g + v.numel);
  }
  return grads;
}

struct Reference {
  std::vector<float> grads;
  int64_t peak_bytes = 0;
};

Reference reference() {
  Arena arena(int64_t{1} << 28);
  Model model(four_block_gpt(), arena);
  model_init_weights(model, 3);
  Reference r;
  two_micro_batches(model);
  r.grads = gradients(model);
  r.peak_bytes = arena.peak_bytes();
  return r;
}

// Blocks 0-2 in host memory: each used forward then backward in both micro-batches.
std::vector<OffloadUse> uses_of_blocks_0_to_2() {
  std::vector<OffloadUse> uses;
  std::vector<bool> seen(4, false);
  for (int mb = 0; mb < 2; ++mb) {
    for (int b : {0, 1, 2}) uses.push_back({b, false, false, 0, mb, 0});
    for (int b : {2, 1, 0}) {
      uses.push_back({b, true, !seen[static_cast<size_t>(b)], 0, mb, 0});
      seen[static_cast<size_t>(b)] = true;
    }
  }
  return uses;
}

TEST(LayerOffload, GradientsMatchTheResidentModelWithALowerPeak) {
  const Reference expected = reference();
  for (int depth : {1, 2}) {
    Arena device(int64_t{1} << 28), host(int64_t{1} << 28, "host");
    HostLink link(2e9);  // paced: the passes wait for some copies
    Model model(four_block_gpt(), device, shard_full(four_block_gpt()), {{true, true, true, false}, &host});
    model_init_weights(model, 3);
    LayerOffload offload(model, uses_of_blocks_0_to_2(), depth, link);
    EXPECT_EQ(offload.slots(), depth + 1);  // min(depth + 1, 3 offloaded blocks)
    model_zero_grad(model);
    offload.step_begin();
    two_micro_batches(model);
    offload.step_end();  // the last gradients are back in host memory
    EXPECT_EQ(gradients(model), expected.grads) << "depth " << depth;
    // Two slots hold one block less than the three blocks' weights and gradients; three do not.
    if (depth == 1) {
      EXPECT_LT(device.peak_bytes(), expected.peak_bytes);
    }
    EXPECT_LE(device.peak_bytes(), expected.peak_bytes);
    EXPECT_GT(host.bytes_in_use(), 0);
    EXPECT_EQ(offload.take_copies().size(), 18u);  // 12 fetches, 6 write-backs
  }
}

TEST(LayerOffload, AUseOutOfThePlannedOrderIsRefused) {
  Arena device(int64_t{1} << 28), host(int64_t{1} << 28, "host");
  HostLink link(0);
  Model model(four_block_gpt(), device, shard_full(four_block_gpt()), {{true, true, true, false}, &host});
  LayerOffload offload(model, uses_of_blocks_0_to_2(), 1, link);
  offload.step_begin();
  EXPECT_THROW(offload.acquire(1, false), Error);  // block 0's forward comes first
  offload.acquire(0, false);
  offload.release(0, false);
  EXPECT_THROW(offload.step_end(), Error);  // the step ended with uses left
}

TEST(ActivationOffload, GradientsMatchTheResidentModelWithALowerPeak) {
  const Reference expected = reference();
  for (int depth : {1, 2}) {
    Arena device(int64_t{1} << 28), host(int64_t{1} << 28, "host");
    HostLink link(2e9);
    Model model(four_block_gpt(), device);
    model_init_weights(model, 3);
    ActivationOffload offload(model, {true, true, true, false}, depth, link, host);
    two_micro_batches(model);
    EXPECT_EQ(gradients(model), expected.grads) << "depth " << depth;
    EXPECT_LT(device.peak_bytes(), expected.peak_bytes);
    EXPECT_EQ(host.bytes_in_use(), 0);  // every parked activation came back and was let go
    EXPECT_EQ(offload.take_copies().size(), 12u);  // 3 blocks out and back, twice
  }
}

}  // namespace
}  // namespace alloy
