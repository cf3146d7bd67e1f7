// Kernel timers: one global table, updated from the calling (master) thread only.
#include "runtime/profile.hpp"

#include <time.h>

namespace alloy {

namespace {

bool g_enabled = false;
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

void profile_enable(bool enabled) { g_enabled = enabled; }
bool profile_enabled() { return g_enabled; }
void profile_reset() { g_profile = KernelProfile{}; }
const KernelProfile& profile_read() { return g_profile; }

ProfileScope::ProfileScope(KernelKind kind) : kind_(kind), active_(g_enabled) {
  if (!active_) return;
  start_ = std::chrono::steady_clock::now();
  cpu_start_seconds_ = process_cpu_seconds();
}

ProfileScope::~ProfileScope() {
  if (!active_) return;
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start_;
  g_profile.seconds[static_cast<size_t>(kind_)] += elapsed.count();
  g_profile.cpu_seconds[static_cast<size_t>(kind_)] += process_cpu_seconds() - cpu_start_seconds_;
  g_profile.calls[static_cast<size_t>(kind_)] += 1;
}

}  // namespace alloy
