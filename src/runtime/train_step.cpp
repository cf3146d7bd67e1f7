// Optimizer step and the single-micro-batch training step.
#include "runtime/train_step.hpp"

#include <cstring>

#include "runtime/cpu/optimizer.hpp"

namespace alloy {

AdamWState::AdamWState(Model& model) : arena(model.arena), numel(model.num_parameters) {
  m = arena->allocate_floats(numel, "adamw.m");
  v = arena->allocate_floats(numel, "adamw.v");
  std::memset(m, 0, static_cast<size_t>(numel) * sizeof(float));
  std::memset(v, 0, static_cast<size_t>(numel) * sizeof(float));
}

AdamWState::~AdamWState() {
  arena->release(v);
  arena->release(m);
}

TrainStepResult optimizer_step(Model& model, AdamWState& state, const TrainSpec& train) {
  TrainStepResult result;
  const double norm = grad_norm(model.grads, model.num_parameters);
  const float lr = lr_schedule(state.step, train.learning_rate, train.min_learning_rate,
                               train.warmup_steps, train.steps);
  state.step++;
  AdamWHyper hyper{lr, static_cast<float>(train.beta1), static_cast<float>(train.beta2),
                   static_cast<float>(train.adam_eps), 0.0f,
                   grad_clip_scale(norm, train.grad_clip)};
  for (const TensorView& view : model.views) {
    hyper.weight_decay = view.weight_decay ? static_cast<float>(train.weight_decay) : 0.0f;
    adamw_update(model.params + view.offset, state.m + view.offset, state.v + view.offset,
                 model.grads + view.offset, view.numel, hyper, state.step);
  }
  result.grad_norm = static_cast<float>(norm);
  result.learning_rate = lr;
  return result;
}

TrainStepResult train_step(Model& model, AdamWState& state, const TrainSpec& train,
                           const int32_t* inputs, const int32_t* targets, int B, int T) {
  model_zero_grad(model);
  const float loss = model_forward(model, inputs, targets, B, T);
  model_backward(model);
  TrainStepResult result = optimizer_step(model, state, train);
  result.loss = loss;
  return result;
}

}  // namespace alloy
