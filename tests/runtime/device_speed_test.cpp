// Emulated slower devices: the stretch rule on its own, and layer profiles taken at an emulated
// speed.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "runtime/device_speed.hpp"
#include "runtime/layer_profile.hpp"
#include "runtime/threads.hpp"
#include "spec/error.hpp"
#include "util/clock.hpp"
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

// Keeps this thread's CPU busy for `seconds` of its CPU clock.
void spin_cpu(double seconds) {
  const double start = thread_cpu_seconds();
  volatile double sink = 0;
  while (thread_cpu_seconds() - start < seconds) sink = sink + 1.0;
}

double monotonic_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

TEST(ComputeStretch, StretchesTheComputeBeforeAWaitAndNotTheWait) {
  const double start = monotonic_now();
  ComputeStretch stretch(3.0);
  spin_cpu(0.005);
  double wait_began = 0, wait_ended = 0;
  const double waited = compute_wait([&] {
    wait_began = monotonic_now();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    wait_ended = monotonic_now();
  });
  const double slept = stretch.finish();
  const double finished = monotonic_now();
  // 5 ms of CPU on a device three times slower take 15 ms before the wait may begin, so that
  // what the wait is for has the device's whole compute time to finish in.
  EXPECT_GE(wait_began - start, 0.015);
  EXPECT_GE(waited, 0.010);
  EXPECT_LT(waited, wait_ended - wait_began + 0.001) << "the stretch is not part of the wait";
  // Nothing was computed after the wait, so nothing is left to stretch at the end (stretching
  // the whole operation at its end would sleep about 10 ms here).
  EXPECT_LT(finished - wait_ended, 0.006);
  // A loaded core may have taken the 15 ms already, leaving less or nothing to sleep.
  EXPECT_LE(slept, wait_began - start);
}

TEST(ComputeStretch, WaitsOutsideAnOperationAreOnlyTimed) {
  const double start = monotonic_now();
  const double waited = compute_wait([] { std::this_thread::sleep_for(std::chrono::milliseconds(2)); });
  EXPECT_GE(waited, 0.002);
  EXPECT_LE(waited, monotonic_now() - start);
  ComputeStretch full_speed(1.0);
  spin_cpu(0.002);
  EXPECT_EQ(full_speed.finish(), 0.0) << "a device at full speed never sleeps";
}

TEST(ComputeStretch, RefusesAnOperationInsideAnother) {
  ComputeStretch outer(2.0);
  EXPECT_THROW(ComputeStretch inner(2.0), Error);
  outer.finish();
  ComputeStretch next(2.0);  // the thread is free again
  EXPECT_LT(next.finish(), 0.001);
}

TEST(LayerSweep, EmulatedSlowdownStretchesEveryShapeAndTheOptimizer) {
  runtime_set_threads(1);
  const ModelSpec model = testing::gpt2("gpt-2x64", 2, 64, 2, 128, 32);
  TrainSpec train;
  train.seq_len = 16;
  train.global_batch_sequences = 2;
  const std::vector<LayerShape> shapes = layer_profile_shapes(model, train, 1);
  ASSERT_FALSE(shapes.empty());
  // The two sweeps' wall times meet whatever load the other tests put on the cores at that
  // moment: a full-speed sweep that shares its core with several MPI ranks runs as long as a
  // stretched one (whose sleeps absorb the sharing), and once measured 0.47 of it. So the best
  // of three pairs counts; a missing stretch fails all three.
  double layer_ratio = 0, optimizer_ratio = 0;
  for (int attempt = 0; attempt < 3 && (layer_ratio <= 2.0 || optimizer_ratio <= 2.0); ++attempt) {
    const LayerSweep full = layer_profile_sweep(model, shapes, {2, 2, 1.0});
    const LayerSweep slow = layer_profile_sweep(model, shapes, {2, 2, 4.0});
    ASSERT_EQ(full.layers.size(), shapes.size());
    ASSERT_EQ(slow.layers.size(), shapes.size());
    EXPECT_GE(full.reference_spread, 1.0);
    double full_total = 0, slow_total = 0;
    for (size_t i = 0; i < shapes.size(); ++i) {
      EXPECT_GT(full.layers[i].forward_seconds, 0);
      EXPECT_GT(full.layers[i].backward_seconds, 0);
      full_total += full.layers[i].forward_seconds + full.layers[i].backward_seconds;
      slow_total += slow.layers[i].forward_seconds + slow.layers[i].backward_seconds;
    }
    layer_ratio = std::max(layer_ratio, slow_total / full_total);
    optimizer_ratio =
        std::max(optimizer_ratio, slow.optimizer_seconds_per_parameter / full.optimizer_seconds_per_parameter);
  }
  // Four times slower by sleeps that follow CPU time.
  EXPECT_GT(layer_ratio, 2.0);
  EXPECT_GT(optimizer_ratio, 2.0);
}

}  // namespace
}  // namespace alloy
