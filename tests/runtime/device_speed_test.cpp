// Emulated slower devices: the stretch rule on its own, and layer profiles taken at an emulated
// speed.
#include <gtest/gtest.h>

#include <chrono>

#include "runtime/device_speed.hpp"
#include "runtime/layer_profile.hpp"
#include "runtime/threads.hpp"
#include "../support/specs.hpp"

namespace alloy {
namespace {

double seconds_of(const auto& work) {
  const auto start = std::chrono::steady_clock::now();
  work();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST(DeviceStretch, SleepsUntilTheSlowdownTimesTheCpuTime) {
  double slept = 0;
  const double wall = seconds_of([&] { slept = device_stretch(3.0, 0.002, 0.002); });
  EXPECT_NEAR(slept, 0.004, 1e-12) << "3 x 2 ms of CPU, of which 2 ms have passed";
  EXPECT_GE(wall, 0.004);
}

TEST(DeviceStretch, DoesNotStretchSharingTwice) {
  // The operation shared its core and already took 7 ms of wall time for 2 ms of CPU time: a
  // device three times slower would have needed 6 ms, so nothing is left to wait.
  EXPECT_EQ(device_stretch(3.0, 0.007, 0.002), 0.0);
  EXPECT_EQ(device_stretch(1.0, 0.001, 0.002), 0.0) << "full speed never sleeps";
}

TEST(LayerSweep, EmulatedSlowdownStretchesEveryShapeAndTheOptimizer) {
  runtime_set_threads(1);
  const ModelSpec model = testing::gpt2("gpt-2x64", 2, 64, 2, 128, 32);
  TrainSpec train;
  train.seq_len = 16;
  train.global_batch_sequences = 2;
  const std::vector<LayerShape> shapes = layer_profile_shapes(model, train, 1);
  ASSERT_FALSE(shapes.empty());
  const LayerSweep full = layer_profile_sweep(model, shapes, {2, 2, 1.0});
  const LayerSweep slow = layer_profile_sweep(model, shapes, {2, 2, 4.0});
  ASSERT_EQ(full.layers.size(), shapes.size());
  ASSERT_EQ(slow.layers.size(), shapes.size());
  double full_total = 0, slow_total = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    EXPECT_GT(full.layers[i].forward_seconds, 0);
    EXPECT_GT(full.layers[i].backward_seconds, 0);
    full_total += full.layers[i].forward_seconds + full.layers[i].backward_seconds;
    slow_total += slow.layers[i].forward_seconds + slow.layers[i].backward_seconds;
  }
  // Four times slower by sleeps that follow CPU time; a shared machine's noise cannot bring the
  // ratio anywhere near 1.
  EXPECT_GT(slow_total / full_total, 2.0);
  EXPECT_GT(slow.optimizer_seconds_per_parameter / full.optimizer_seconds_per_parameter, 2.0);
  EXPECT_GE(full.reference_spread, 1.0);
}

}  // namespace
}  // namespace alloy
