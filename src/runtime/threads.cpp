// Thread-count policy: OpenMP threads for everything, OpenBLAS single-threaded per call.
#include "runtime/threads.hpp"

#include <cblas.h>
#include <omp.h>

#include <cstdlib>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "runtime/cpu/blas_core.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace {

int g_threads = 0;  // 0: not set yet

int env_int(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < 1) {
    throw Error(fmt::format("environment variable {}='{}' is not a positive integer", name, text),
                {}, fmt::format("unset {} or give it a positive thread count", name));
  }
  return static_cast<int>(value);
}

}  // namespace

int runtime_threads_for_ranks(int ranks_on_host) {
  if (int threads = env_int("ALLOY_THREADS"); threads > 0) return threads;
  int cores = static_cast<int>(std::thread::hardware_concurrency());
  if (cores < 1) cores = 1;
  if (ranks_on_host < 1) ranks_on_host = 1;
  return cores / ranks_on_host > 1 ? cores / ranks_on_host : 1;
}

int runtime_default_threads() { return runtime_threads_for_ranks(env_int("OMPI_COMM_WORLD_LOCAL_SIZE")); }

void runtime_set_threads(int n) {
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
