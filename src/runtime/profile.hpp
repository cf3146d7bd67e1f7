// Per-kernel timers (wall clock and process CPU time) of the CPU runtime, since perf is not
// available here: off by default, a branch per kernel call when off. The benchmark and the trainer's progress line read them.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>

namespace alloy {

enum class KernelKind {
  KernelKind_matmul,       // linear layers (forward and backward GEMMs)
  KernelKind_attention,    // attention scores, softmax, context and their backward
  KernelKind_norm,         // LayerNorm, RMSNorm
  KernelKind_elementwise,  // GELU, SwiGLU, residual adds, RoPE
  KernelKind_embedding,
  KernelKind_loss,         // softmax cross-entropy
  KernelKind_optimizer,    // gradient norm, clipping, AdamW
  KernelKind_count,
};

const char* kernel_kind_name(KernelKind kind);

struct KernelProfile {
  std::array<double, static_cast<size_t>(KernelKind::KernelKind_count)> seconds{};      // wall
  std::array<double, static_cast<size_t>(KernelKind::KernelKind_count)> cpu_seconds{};  // process
  std::array<int64_t, static_cast<size_t>(KernelKind::KernelKind_count)> calls{};
  double total_seconds() const;
  double total_cpu_seconds() const;
};

// Measured GEMM throughput (FLOP/s) of matmul_forward on (n, n) x (n, n)^T at the current thread
// setting, best of `repeats`: the peak that model FLOPs utilisation is reported against.
double profile_gemm_flops(int n = 1024, int repeats = 3);

void profile_enable(bool enabled);
bool profile_enabled();
void profile_reset();
const KernelProfile& profile_read();

// Adds the scope's wall and process CPU time to `kind` when profiling is on (CPU time is
// robust to other load on the machine when the runtime uses one thread). A scope opened while
// another is timing (matmul_backward calling matmul_backward_weight_rows) counts neither its
// time nor its call: the outer scope holds them, so the kinds' times add up to the kernels'.
class ProfileScope {
 public:
  explicit ProfileScope(KernelKind kind);
  ~ProfileScope();
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  KernelKind kind_;
  bool active_;
  std::chrono::steady_clock::time_point start_;
  double cpu_start_seconds_ = 0.0;
};

}  // namespace alloy
