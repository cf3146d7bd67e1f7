// Kernel timers: one global table, updated from the calling (master) thread only.
#include "runtime/profile.hpp"

#include <time.h>

#include <algorithm>
#include <vector>

#include "runtime/cpu/matmul.hpp"

namespace alloy {

namespace {

bool g_enabled = false;
bool g_scope_open = false;  // a scope is timing: one nested in it (a kernel calling another) adds nothing
KernelProfile g_profile;

double process_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

}  // namespace

const char* kernel_kind_name(KernelKind kind) {
  switch (kind) {
    case KernelKind::KernelKind_matmul: return "matmul";
    case KernelKind::KernelKind_attention: return "attention";
    case KernelKind::KernelKind_norm: return "norm";
    case KernelKind::KernelKind_elementwise: return "elementwise";
    case KernelKind::KernelKind_embedding: return "embedding";
    case KernelKind::KernelKind_loss: return "loss";
    case KernelKind::KernelKind_optimizer: return "optimizer";
    case KernelKind::KernelKind_count: break;
  }
  return "?";
}

double KernelProfile::total_seconds() const {
  double total = 0.0;
  for (double s : seconds) total += s;
  return total;
}

double KernelProfile::total_cpu_seconds() const {
  double total = 0.0;
  for (double s : cpu_seconds) total += s;
  return total;
}

double profile_gemm_flops(int n, int repeats) {
  const size_t elements = static_cast<size_t>(n) * n;
  std::vector<float> a(elements, 0.5f), b(elements, 0.25f), c(elements);
  double best_seconds = 0.0;
  for (int r = 0; r < std::max(1, repeats); r++) {
    const auto start = std::chrono::steady_clock::now();
    matmul_forward(c.data(), a.data(), b.data(), nullptr, n, n, n);
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    if (r == 0 || elapsed.count() < best_seconds) best_seconds = elapsed.count();
  }
  return 2.0 * n * static_cast<double>(n) * n / best_seconds;
}

void profile_enable(bool enabled) { g_enabled = enabled; }
bool profile_enabled() { return g_enabled; }
void profile_reset() { g_profile = KernelProfile{}; }
const KernelProfile& profile_read() { return g_profile; }

ProfileScope::ProfileScope(KernelKind kind) : kind_(kind), active_(g_enabled && !g_scope_open) {
  if (!active_) return;
  g_scope_open = true;
  start_ = std::chrono::steady_clock::now();
  cpu_start_seconds_ = process_cpu_seconds();
}

ProfileScope::~ProfileScope() {
  if (!active_) return;
  g_scope_open = false;
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start_;
  g_profile.seconds[static_cast<size_t>(kind_)] += elapsed.count();
  g_profile.cpu_seconds[static_cast<size_t>(kind_)] += process_cpu_seconds() - cpu_start_seconds_;
  g_profile.calls[static_cast<size_t>(kind_)] += 1;
}

}  // namespace alloy
