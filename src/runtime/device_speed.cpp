// Emulated device speed and time dilation from the cluster file and the environment.
#include "runtime/device_speed.hpp"

#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "cost/runtime_traits.hpp"
#include "spec/error.hpp"
#include "util/clock.hpp"

namespace alloy {

namespace {

// The ComputeStretch running on this thread, if any.
thread_local ComputeStretch* running_stretch = nullptr;

double monotonic_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The environment variable as a number in [low, high], or `fallback` when unset.
double env_number(const char* name, double low, double high, double fallback, const char* hint) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  if (*end != '\0' || !(value >= low) || !(value <= high))
    throw Error(fmt::format("{}='{}' is not a number in [{}, {}]", name, text, low, high), {"", name}, hint);
  return value;
}

}  // namespace

double device_speed(const DeviceType& type) {
  const double speed = env_number("ALLOY_DEVICE_SPEED", 1e-3, 1.0, 0.0, "give e.g. 0.5 for half speed, or unset it");
  if (speed > 0) return speed;
  return type.speed > 0 ? type.speed : 1.0;
}

double emulation_dilation(int ranks_on_host, int threads_per_rank) {
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const double automatic = shared_cores_dilation(ranks_on_host * threads_per_rank, cores);
  return env_number("ALLOY_TIME_DILATION", 1.0, 1000.0, automatic, "give a factor >= 1, or unset it");
}

int emulated_ranks_on_host(const ClusterSpec& cluster, int local_ranks, bool single_host) {
  if (!single_host) return local_ranks;
  int cpu_devices = 0;
  for (const Device& d : cluster.devices) cpu_devices += cluster.device_type(d).is_cpu ? 1 : 0;
  return std::max(local_ranks, cpu_devices);
}

double device_slowdown(const DeviceType& type, int ranks_on_host, int threads_per_rank) {
  if (!type.is_cpu) return 1.0;
  return emulation_dilation(ranks_on_host, threads_per_rank) / device_speed(type);
}

double device_stretch(double slowdown, double elapsed_seconds, double cpu_seconds) {
  const double sleep_seconds = slowdown * cpu_seconds - elapsed_seconds;
  if (slowdown <= 1.0 || sleep_seconds <= 0) return 0;
  std::this_thread::sleep_for(std::chrono::duration<double>(sleep_seconds));
  return sleep_seconds;
}

ComputeStretch::ComputeStretch(double slowdown) : slowdown_(slowdown) {
  if (running_stretch != nullptr)
    throw Error("a compute operation began inside another on the same thread", {},
                "finish the running ComputeStretch first");
  // Stretches between waits are short (a block's GEMMs); Linux would lengthen each sleep by the
  // default timer slack of 50 us.
  if (slowdown_ > 1.0) prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
  running_stretch = this;
  resume();
}

ComputeStretch::~ComputeStretch() {
  if (running_stretch == this) running_stretch = nullptr;
}

double ComputeStretch::finish() {
  if (!finished_) {
    pause();
    finished_ = true;
    running_stretch = nullptr;
  }
  return slept_;
}

void ComputeStretch::pause() {
  slept_ += device_stretch(slowdown_, monotonic_seconds() - wall_mark_, thread_cpu_seconds() - cpu_mark_);
}

void ComputeStretch::resume() {
  wall_mark_ = monotonic_seconds();
  cpu_mark_ = thread_cpu_seconds();
}

double compute_wait(const std::function<void()>& blocking) {
  ComputeStretch* stretch = running_stretch;
  if (stretch != nullptr) stretch->pause();
  const double start = monotonic_seconds();
  blocking();
  const double waited = monotonic_seconds() - start;
  if (stretch != nullptr) stretch->resume();
  return waited;
}

}  // namespace alloy
