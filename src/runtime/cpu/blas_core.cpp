// OpenBLAS kernel family: detection, the upgrade rule, and the switch through OpenBLAS's own
// DYNAMIC_ARCH entry points (reached only where the library exports them).
#include "runtime/cpu/blas_core.hpp"

#include <cblas.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

// Exported by OpenBLAS builds with DYNAMIC_ARCH: `quit` forgets the chosen family, `init`
// chooses again, reading OPENBLAS_CORETYPE first. Weak, so other BLAS builds link too.
extern "C" {
void gotoblas_dynamic_init(void) __attribute__((weak));
void gotoblas_dynamic_quit(void) __attribute__((weak));
}

namespace alloy {

namespace {

enum class VectorLevel { unknown, sse, avx, avx2, avx512 };

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

// The instruction set of OpenBLAS's x86-64 kernel families (driver/others/dynamic.c's names).
VectorLevel core_level(const std::string& name) {
  static const std::pair<std::string_view, VectorLevel> table[] = {
      {"katmai", VectorLevel::sse},        {"coppermine", VectorLevel::sse},
      {"northwood", VectorLevel::sse},     {"prescott", VectorLevel::sse},
      {"banias", VectorLevel::sse},        {"atom", VectorLevel::sse},
      {"core2", VectorLevel::sse},         {"penryn", VectorLevel::sse},
      {"dunnington", VectorLevel::sse},    {"nehalem", VectorLevel::sse},
      {"athlon", VectorLevel::sse},        {"opteron", VectorLevel::sse},
      {"opteron_sse3", VectorLevel::sse},  {"barcelona", VectorLevel::sse},
      {"nano", VectorLevel::sse},          {"bobcat", VectorLevel::sse},
      {"sandybridge", VectorLevel::avx},   {"bulldozer", VectorLevel::avx},
      {"piledriver", VectorLevel::avx},    {"haswell", VectorLevel::avx2},
      {"steamroller", VectorLevel::avx2},  {"excavator", VectorLevel::avx2},
      {"zen", VectorLevel::avx2},          {"skylakex", VectorLevel::avx512},
      {"cooperlake", VectorLevel::avx512}, {"sapphirerapids", VectorLevel::avx512}};
  const std::string key = lower(name);
  for (const auto& [core, level] : table)
    if (key == core) return level;
  return VectorLevel::unknown;
}

BlasCore blas_core_select() {
  BlasCore core;
  core.detected = openblas_get_corename();
  core.name = core.detected;
  if (const char* forced = std::getenv("OPENBLAS_CORETYPE"); forced != nullptr && *forced != '\0') {
    core.note = fmt::format("OpenBLAS kernels: {} (OPENBLAS_CORETYPE={})", core.name, forced);
    return core;
  }
  const std::string target = blas_core_upgrade(core.detected, cpu_vector_features());
  if (target.empty() || gotoblas_dynamic_init == nullptr || gotoblas_dynamic_quit == nullptr) {
    core.note = fmt::format("OpenBLAS kernels: {}", core.name);
    return core;
  }
  setenv("OPENBLAS_CORETYPE", target.c_str(), 1);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  unsetenv("OPENBLAS_CORETYPE");
  core.name = openblas_get_corename();
  core.note = fmt::format("OpenBLAS kernels: {} (OpenBLAS chose {}, older than this CPU's vector "
                          "instructions; set OPENBLAS_CORETYPE to override)",
                          core.name, core.detected);
  return core;
}

}  // namespace

CpuVectorFeatures cpu_vector_features() {
  CpuVectorFeatures f;
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  f.avx = __builtin_cpu_supports("avx");
  f.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  f.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  f.avx512_bf16 = f.avx512 && __builtin_cpu_supports("avx512bf16");
#endif
  return f;
}

std::string blas_core_upgrade(const std::string& detected, const CpuVectorFeatures& features) {
  const VectorLevel have = core_level(detected);
  if (have == VectorLevel::unknown) return "";
  std::string target;
  VectorLevel level = VectorLevel::unknown;
  if (features.avx512) {
    target = features.avx512_bf16 ? "Cooperlake" : "SkylakeX";
    level = VectorLevel::avx512;
  } else if (features.avx2_fma) {
    target = "Haswell";
    level = VectorLevel::avx2;
  } else if (features.avx) {
    target = "Sandybridge";
    level = VectorLevel::avx;
  }
  return level > have ? target : "";
}

const BlasCore& blas_core() {
  static const BlasCore core = blas_core_select();
  return core;
}

}  // namespace alloy
