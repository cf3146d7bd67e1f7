// Chrome trace export of a simulated step: one process per rank, one thread per stream, a
// complete event per operation and a memory counter; on clusters with racks or sites, one more
// process with the transfers on each rack uplink and WAN port and each one's load. Opens in
// Perfetto and chrome://tracing.
#pragma once

#include <string>

#include "plan/plan.hpp"
#include "plan/timeline.hpp"

namespace alloy {

struct TraceOptions {
  // Up to this many ranks, every rank of a stage gets its own process (replicas share their
  // representative's timeline); above it, one process per stage stands for all its ranks.
  int max_ranks = 256;
};

// {"traceEvents": [...], "displayTimeUnit": "ms"} with times in microseconds.
std::string trace_json(const SimResult& result, const Plan& plan, const TraceOptions& options = {});
// Writes trace_json to `path`; throws alloy::Error when the file cannot be written.
void trace_save(const SimResult& result, const Plan& plan, const std::string& path, const TraceOptions& options = {});

}  // namespace alloy
