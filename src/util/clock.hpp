// Clock helpers shared by the runtime's timers.
#pragma once

#include <time.h>

#include <chrono>

namespace alloy {

// Seconds from `start` to now on the steady clock.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// CPU seconds the calling thread has run: unlike wall time, it does not grow while the thread
// waits for a core other processes hold, or blocks.
inline double thread_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

}  // namespace alloy
