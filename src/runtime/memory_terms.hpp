// The terms a rank's device memory is reported by, measured and predicted alike: the arena's
// buffers by name on one side, the plan's per-device memory terms on the other, so the two line
// up term by term in the step log and the end-of-run report.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "plan/plan.hpp"

namespace alloy {

enum class MemoryTermKind {
  MemoryTermKind_parameters,       // weights: resident, ZeRO pieces, gathered copies, offload window
  MemoryTermKind_gradients,        // full, sharded and bucket gradient buffers
  MemoryTermKind_optimizer_state,  // AdamW moments, and fp32 master weights where a backend keeps them
  MemoryTermKind_activations,      // what the passes keep for backward, pipeline inputs and outputs
  MemoryTermKind_buffers,          // backward workspace, communication and scratch
  MemoryTermKind_other             // a buffer no term claims (so the terms always sum to the peak)
};
inline constexpr int kMemoryTermKinds = 6;

// Bytes per term, indexed by MemoryTermKind. Fixed size: it travels between ranks as bytes.
using MemoryTermBytes = std::array<int64_t, kMemoryTermKinds>;

// For people: "parameters", "gradients", "optimizer state", ...
const char* memory_term_name(MemoryTermKind kind);
// For machines (JSON keys): "parameters", "gradients", "optimizer_state", ...
const char* memory_term_key(MemoryTermKind kind);

// The term of an arena buffer, by the name it was allocated under; "other" for unknown names.
MemoryTermKind memory_term_of_buffer(const std::string& name);
// An arena's peak breakdown (Arena::peak_breakdown: bytes by buffer name) summed by term.
MemoryTermBytes memory_terms_measured(const std::vector<std::pair<std::string, int64_t>>& breakdown);

// The term of one of the plan's memory terms (names from plan evaluation), or nothing when that
// memory is not in the rank's arena (framework context, communication library buffers, allocator
// margin, host memory). The offload window holds offloaded blocks' weights and gradients when
// the stage offloads weights (parameters), else only parked activations on their way back.
std::optional<MemoryTermKind> memory_term_of_predicted(const std::string& name, bool offloads_weights);
// The plan's per-device memory that lives in the rank's arena, by term.
std::array<double, kMemoryTermKinds> memory_terms_predicted(const std::vector<MemoryTerm>& memory,
                                                            bool offloads_weights);

}  // namespace alloy
