// The offloaded blocks' uses of a lane's step, with the bytes each moves over the host link.
#include "sim/offload_uses.hpp"

#include <algorithm>
#include <map>

namespace alloy {

namespace {

// Global block -> whether the stage keeps it in host memory.
std::map<int, bool> offloaded_blocks(const PlanStage& st) {
  std::map<int, bool> offloaded;
  int local = 0;  // the block's index among the stage's (chunks in order), as `offload` counts
  for (const LayerRange& chunk : st.chunks)
    for (int b = chunk.begin; b < chunk.end; ++b, ++local)
      offloaded[b] = static_cast<size_t>(local) < st.offload.size() && st.offload[static_cast<size_t>(local)];
  return offloaded;
}

}  // namespace

std::vector<SimOffloadUse> sim_offload_uses(const Plan& plan, const ModelSpec& model, const RankSchedule& rs) {
  std::map<int, bool> offloaded = offloaded_blocks(plan.stages[static_cast<size_t>(rs.stage)]);
  std::map<int, int> last_backward;  // block -> its latest backward use
  std::vector<SimOffloadUse> uses;
  for (size_t i = 0; i < rs.ops.size(); ++i) {
    const ScheduleOp& op = rs.ops[i];
    const bool forward = op.kind == OpKind::OpKind_forward;
    if (!forward && op.kind != OpKind::OpKind_backward) continue;
    for (int k = 0; k < op.block_end - op.block_begin; ++k) {
      const int b = forward ? op.block_begin + k : op.block_end - 1 - k;
      if (!offloaded[b]) continue;
      SimOffloadUse use;
      use.op_index = static_cast<int>(i);
      use.block = b;
      use.backward = !forward;
      use.fetch_bytes = schedule_offloaded_block_bytes(plan, model, rs.stage, rs.dp_rank, b, precision_bytes(plan.precision));
      if (!forward) {
        const int64_t gradients = schedule_offloaded_block_bytes(plan, model, rs.stage, rs.dp_rank, b, plan.gradient_bytes);
        const auto previous = last_backward.find(b);
        if (previous != last_backward.end()) {
          use.previous_backward = previous->second;
          use.fetch_bytes += gradients;
        }
        use.write_back_bytes = gradients;
        last_backward[b] = static_cast<int>(uses.size());
      }
      uses.push_back(use);
    }
  }
  return uses;
}

int64_t sim_offloaded_weight_bytes(const Plan& plan, const ModelSpec& model, int stage, int dp_rank, int begin, int end) {
  std::map<int, bool> offloaded = offloaded_blocks(plan.stages[static_cast<size_t>(stage)]);
  int64_t bytes = 0;
  for (int b = begin; b < end; ++b)
    if (offloaded[b]) bytes += schedule_offloaded_block_bytes(plan, model, stage, dp_rank, b, precision_bytes(plan.precision));
  return bytes;
}

int sim_offload_slots(const PlanStage& st) {
  const int blocks = static_cast<int>(std::count(st.offload.begin(), st.offload.end(), true));
  return std::min(std::max(1, st.offload_prefetch_depth) + 1, std::max(1, blocks));
}

}  // namespace alloy
