// Plans built by hand for schedule and simulator tests: stage shapes, layer counts and
// per-micro-batch times are given directly, devices are taken in order.
#pragma once

#include <vector>

#include "../support/specs.hpp"
#include "plan/plan.hpp"

namespace alloy::testing {

struct StageSpec {
  int tp = 1;
  int dp = 1;
  int zero = 0;
  int blocks_per_chunk = 1;
  double forward_seconds = 0.01;
  double backward_seconds = 0.02;
  int offloaded_blocks = 0;  // the first blocks of the stage
  int first_device = -1;     // -1: right after the previous stage
};

inline Plan hand_plan(const ModelSpec& model, int num_devices, const std::vector<StageSpec>& specs, int micro_batches,
                      int64_t micro_batch_sequences, Schedule schedule, int virtual_chunks = 1) {
  Plan plan;
  plan.model_name = model.name;
  plan.num_devices = num_devices;
  plan.seq_len = 128;
  plan.micro_batch_sequences = micro_batch_sequences;
  plan.num_micro_batches = micro_batches;
  plan.global_batch_sequences = micro_batch_sequences * micro_batches;
  plan.schedule = schedule;
  plan.virtual_chunks = virtual_chunks;
  const int p = static_cast<int>(specs.size());
  int device = 0;
  for (int s = 0; s < p; ++s) {
    const StageSpec& spec = specs[s];
    PlanStage st;
    st.device_type = "a100-80";
    st.tp = spec.tp;
    st.dp = spec.dp;
    st.zero = spec.zero;
    if (spec.first_device >= 0) device = spec.first_device;
    for (int i = 0; i < spec.tp * spec.dp; ++i) st.device_ids.push_back(device++);
    st.has_embedding = s == 0;
    st.has_head = s == p - 1;
    st.forward_seconds = spec.forward_seconds;
    st.backward_seconds = spec.backward_seconds;
    plan.stages.push_back(st);
  }
  // Pipeline order: chunk 0 of every stage, then chunk 1, ...
  int layer = 0;
  for (int c = 0; c < virtual_chunks; ++c)
    for (int s = 0; s < p; ++s) {
      plan.stages[s].chunks.push_back({layer, layer + specs[s].blocks_per_chunk});
      layer += specs[s].blocks_per_chunk;
    }
  for (int s = 0; s < p; ++s) {
    PlanStage& st = plan.stages[s];
    st.recompute.assign(st.num_blocks(), Recompute::Recompute_none);
    st.offload.assign(st.num_blocks(), false);
    for (int b = 0; b < specs[s].offloaded_blocks; ++b) st.offload[b] = true;
  }
  plan.num_layers = layer;
  return plan;
}

// A model with exactly `layers` blocks (small GPT-2 shape, so byte counts stay modest).
inline ModelSpec model_with_layers(int layers) {
  ModelSpec m = gpt2("test-gpt", layers, 256, 4, 1024, 512);
  return m;
}

}  // namespace alloy::testing
