// One optimizer step of the single-rank trainer: forward, backward, global-norm clipping and
// AdamW with the warm-up plus cosine schedule, on the model's flat buffers.
#pragma once

#include <cstdint>

#include "runtime/model.hpp"
#include "spec/train.hpp"

namespace alloy {

// AdamW moments m and v: flat buffers in the arena, aligned element for element with
// model.params.
struct AdamWState {
  explicit AdamWState(Model& model);
  ~AdamWState();
  AdamWState(const AdamWState&) = delete;
  AdamWState& operator=(const AdamWState&) = delete;

  Arena* arena;
  int64_t numel = 0;
  float* m = nullptr;  // (num_parameters)
  float* v = nullptr;  // (num_parameters)
  int64_t step = 0;    // optimizer steps taken
};

struct TrainStepResult {
  float loss = 0.0f;           // mean cross-entropy of the batch, before the update
  float grad_norm = 0.0f;      // global L2 norm before clipping
  float learning_rate = 0.0f;  // used for this step
};

// Updates the parameters with the model's current gradients: clip to train.grad_clip, then AdamW
// at lr_schedule(state.step, ...) from `train`; weight decay only on 2-D weights.
// Returns (grad_norm, learning_rate); the caller owns forward and backward.
TrainStepResult optimizer_step(Model& model, AdamWState& state, const TrainSpec& train);

// zero_grad, forward, backward and optimizer_step on one micro-batch of (B, T) tokens.
TrainStepResult train_step(Model& model, AdamWState& state, const TrainSpec& train,
                           const int32_t* inputs, const int32_t* targets, int B, int T);

}  // namespace alloy
