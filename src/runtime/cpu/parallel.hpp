// When a CPU kernel is worth an OpenMP parallel region: below these sizes the region's start and
// barrier cost more than the work, and on a loaded machine a descheduled worker stalls it.
#pragma once

#include <cstdint>

namespace alloy {

inline constexpr int64_t kParallelMinElements = int64_t{1} << 15;  // elementwise and row loops
inline constexpr int64_t kParallelMinMacs = int64_t{1} << 22;      // GEMMs and attention

}  // namespace alloy
