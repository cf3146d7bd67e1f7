#include "runtime/trainer.hpp"

#include <chrono>
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "plan/plan.hpp"
#include "runtime/arena.hpp"
#include "runtime/profile.hpp"
#include "runtime/io/checkpoint.hpp"
#include "runtime/model.hpp"
#include "runtime/threads.hpp"
#include "runtime/train_step.hpp"
#include "runtime/trainer_common.hpp"
#include "spec/error.hpp"
#include "util/clock.hpp"

namespace alloy {

namespace {

using Clock = std::chrono::steady_clock;

double validation_loss(Model& model, const BatchLoader& val, int64_t batches, std::vector<int32_t>& inputs,
                       std::vector<int32_t>& targets) {
  const int B = static_cast<int>(val.local_batch_size());
  const int T = static_cast<int>(val.options().seq_len);
  const int64_t count = std::max<int64_t>(1, std::min<int64_t>(batches, val.batches_per_epoch()));
  double sum = 0;
  for (int64_t k = 0; k < count; ++k) {
    batch_loader_read(val, static_cast<uint64_t>(k), inputs.data(), targets.data());
    sum += model_forward(model, inputs.data(), targets.data(), B, T);
    model_release_activations(model);
  }
  return sum / static_cast<double>(count);
}

}  // namespace

std::string trainer_model_fingerprint(const ModelSpec& m) { return m.name + "@" + model_fingerprint(m); }

TrainerResult trainer_run(const ModelSpec& spec, const TrainSpec& train, const TrainerOptions& o,
                          const std::function<void(const StepReport&)>& on_step) {
  runtime_set_threads(o.threads);
  const int64_t batch = o.batch_size > 0 ? o.batch_size : train.global_batch_sequences;
  trainer_check_seq_len(spec, train);
  TrainerData data = trainer_data_open(spec, train, o, batch);

  Arena arena(o.memory_cap_bytes > 0 ? static_cast<int64_t>(o.memory_cap_bytes) : (int64_t{64} << 30));
  Model model(spec, arena);
  model.recompute.assign(static_cast<size_t>(spec.num_layers), o.recompute);
  model_init_weights(model, train.seed);
  AdamWState optimizer(model);

  TrainerResult result;
  const std::string fingerprint = trainer_model_fingerprint(spec);
  if (o.resume) {
    if (o.checkpoint_dir.empty()) throw Error("--resume needs --checkpoint DIR", {"", "--resume"}, "name the checkpoint folder");
    CheckpointState state = checkpoint_load(o.checkpoint_dir, fingerprint, trainer_parameter_refs(model, model.params, ""),
                                            trainer_optimizer_refs(model, optimizer.m, optimizer.v));
    batch_loader_state_restore(data.train, state.loader_state);
    optimizer.step = state.step;
    result.first_step = state.step;
  }

  result.gemm_peak_flops = profile_gemm_flops(512, 4);
  const double flops_per_token = model_flops_per_token(spec, train.seq_len).training;
  const int B = static_cast<int>(batch), T = static_cast<int>(train.seq_len);
  std::vector<int32_t> inputs(static_cast<size_t>(B) * T), targets(inputs.size());
  StepLog log(o.log_path);
  if (data.val && !o.resume) {
    result.initial_val_loss = validation_loss(model, *data.val, o.val_batches, inputs, targets);
  }

  auto save = [&](int64_t step) {
    CheckpointState state;
    state.step = step;
    state.loader_state = batch_loader_state_save(data.train);
    state.fingerprint = fingerprint;
    checkpoint_save(o.checkpoint_dir, trainer_parameter_refs(model, model.params, ""),
                    trainer_optimizer_refs(model, optimizer.m, optimizer.v), state);
  };

  for (int64_t step = result.first_step + 1; step <= train.steps; ++step) {
    auto start = Clock::now();
    batch_loader_next(data.train, inputs.data(), targets.data());
    TrainStepResult r = train_step(model, optimizer, train, inputs.data(), targets.data(), B, T);
    StepReport report;
    report.step = step;
    report.loss = r.loss;
    report.learning_rate = r.learning_rate;
    report.grad_norm = r.grad_norm;
    report.step_seconds = seconds_since(start);
    report.tokens_per_second = static_cast<double>(B) * T / report.step_seconds;
    report.mfu = report.tokens_per_second * flops_per_token / result.gemm_peak_flops;
    report.peak_arena_bytes = arena.peak_bytes();
    const bool last = step == train.steps;
    if (data.val && ((o.val_every > 0 && step % o.val_every == 0) || last)) {
      report.val_loss = validation_loss(model, *data.val, o.val_batches, inputs, targets);
      if (last) result.final_val_loss = report.val_loss;
    }
    if (!o.checkpoint_dir.empty() && ((o.checkpoint_every > 0 && step % o.checkpoint_every == 0) || last)) save(step);
    log.write(report);
    if (o.progress) trainer_print_progress(report, train.steps);
    if (on_step) on_step(report);
    result.steps.push_back(report);
  }
  result.peak_arena_bytes = arena.peak_bytes();
  return result;
}

}  // namespace alloy
