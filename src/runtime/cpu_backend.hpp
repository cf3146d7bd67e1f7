// The CPU backend of the executor: fp32 passes on this machine's cores, tensors in host memory.
#pragma once

#include <memory>

#include "runtime/stage_backend.hpp"

namespace alloy {

// Builds the shard in an arena capped at request.memory_cap_bytes and initialises its weights.
std::unique_ptr<StageBackend> stage_backend_cpu(const StageRequest& request);

}  // namespace alloy
