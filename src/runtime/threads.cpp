// Thread-count policy: OpenMP threads for everything, OpenBLAS single-threaded per call.
#include "runtime/threads.hpp"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "runtime/cpu/blas_core.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace {

int g_threads = 0;  // 0: not set yet

int hardware_threads() { return std::max(1, static_cast<int>(std::thread::hardware_concurrency())); }

// A whole number in [1, high] from the environment variable `name`; 0 when it is unset.
int env_int(const char* name, int high) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return 0;
  int value = 0;
  const char* end = text + std::strlen(text);
  auto [stop, error] = std::from_chars(text, end, value);
  if (error != std::errc() || stop != end || value < 1 || value > high) {
    throw Error(fmt::format("environment variable {}='{}' is not a whole number in [1, {}]", name, text, high),
                {"", name}, fmt::format("unset {} or give it a count from 1 to {}", name, high));
  }
  return value;
}

}  // namespace

int runtime_threads_limit() { return std::max(8, 4 * hardware_threads()); }

int runtime_threads_for_ranks(int ranks_on_host) {
  if (int threads = env_int("ALLOY_THREADS", runtime_threads_limit()); threads > 0) return threads;
  const int cores = hardware_threads();
  if (ranks_on_host < 1) ranks_on_host = 1;
  return cores / ranks_on_host > 1 ? cores / ranks_on_host : 1;
}

int runtime_default_threads() { return runtime_threads_for_ranks(env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1 << 20)); }

void runtime_set_threads(int n) {
  if (n > runtime_threads_limit()) {
    throw Error(fmt::format("{} threads asked for; this machine has {} hardware threads", n, hardware_threads()),
                {"", "--threads"}, fmt::format("give --threads from 1 to {}", runtime_threads_limit()));
  }
  blas_core();  // before any GEMM: OpenBLAS's kernel family is chosen once per process
  g_threads = n >= 1 ? n : runtime_default_threads();
  omp_set_num_threads(g_threads);
  openblas_set_num_threads(1);
}

int runtime_threads() {
  if (g_threads == 0) runtime_set_threads(0);
  return g_threads;
}

}  // namespace alloy
