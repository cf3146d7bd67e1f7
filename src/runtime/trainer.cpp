#include "runtime/trainer.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "plan/plan.hpp"
#include "runtime/arena.hpp"
#include "runtime/profile.hpp"
#include "runtime/io/batch_loader.hpp"
#include "runtime/io/checkpoint.hpp"
#include "runtime/io/token_file.hpp"
#include "runtime/model.hpp"
#include "runtime/threads.hpp"
#include "runtime/train_step.hpp"
#include "spec/error.hpp"
#include "spec/units.hpp"

namespace alloy {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Views of the model's parameters and of the AdamW moments, for checkpoints.
std::vector<TensorRef> parameter_refs(Model& model, float* base, const std::string& prefix) {
  std::vector<TensorRef> refs;
  refs.reserve(model.views.size());
  for (const auto& v : model.views) refs.push_back({prefix + v.name, v.shape, base + v.offset});
  return refs;
}

// The AdamW moments, named "adamw.m.<param>" and "adamw.v.<param>".
std::vector<TensorRef> optimizer_refs(Model& model, AdamWState& optimizer) {
  std::vector<TensorRef> refs = parameter_refs(model, optimizer.m, "adamw.m.");
  for (auto& r : parameter_refs(model, optimizer.v, "adamw.v.")) refs.push_back(std::move(r));
  return refs;
}

struct Data {
  BatchLoader train;
  std::optional<BatchLoader> val;
};

Data data_open(const ModelSpec& model, const TrainSpec& train, const TrainerOptions& o, int64_t batch) {
  if (o.train_data.empty()) {
    throw Error("no training data given", {"", "--data"}, "pass --data FILE.bin (make one with `alloy tokenize`)");
  }
  BatchLoaderOptions lo;
  lo.batch_size = batch;
  lo.seq_len = train.seq_len;
  lo.seed = train.seed;
  Data d{batch_loader_create(token_file_open(o.train_data, model.vocab_size), lo), std::nullopt};
  if (!o.val_data.empty()) {
    BatchLoaderOptions vo = lo;
    vo.sampling = BatchSampling::BatchSampling_sequential;
    d.val = batch_loader_create(token_file_open(o.val_data, model.vocab_size), vo);
  }
  return d;
}

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

class StepLog {
 public:
  explicit StepLog(const std::string& path) {
    if (path.empty()) return;
    out_.open(path, std::ios::app);
    if (!out_) throw Error("cannot open the log file for writing", {path, "--log"}, "check the folder exists and is writable");
  }
  void write(const StepReport& r) {
    if (!out_.is_open()) return;
    nlohmann::json j = {{"step", r.step},       {"loss", r.loss},
                        {"lr", r.learning_rate}, {"grad_norm", r.grad_norm},
                        {"step_seconds", r.step_seconds}, {"tokens_per_second", r.tokens_per_second},
                        {"mfu", r.mfu},         {"peak_arena_bytes", r.peak_arena_bytes}};
    if (r.val_loss) j["val_loss"] = *r.val_loss;
    out_ << j.dump() << "\n";
    out_.flush();
  }

 private:
  std::ofstream out_;
};

void print_progress(const StepReport& r, int64_t total_steps) {
  std::string line = fmt::format("step {:>5}/{}  loss {:.4f}  lr {:.2e}  gnorm {:.3f}  {:.0f} tok/s  mfu {:.1f}%  peak {}",
                                 r.step, total_steps, r.loss, r.learning_rate, r.grad_norm, r.tokens_per_second,
                                 100.0 * r.mfu, units_format_bytes(static_cast<double>(r.peak_arena_bytes)));
  if (r.val_loss) line += fmt::format("  val {:.4f}", *r.val_loss);
  std::fprintf(stderr, "%s\n", line.c_str());
}

}  // namespace

std::string trainer_model_fingerprint(const ModelSpec& m) { return m.name + "@" + model_fingerprint(m); }

TrainerResult trainer_run(const ModelSpec& spec, const TrainSpec& train, const TrainerOptions& o,
                          const std::function<void(const StepReport&)>& on_step) {
  runtime_set_threads(o.threads);
  const int64_t batch = o.batch_size > 0 ? o.batch_size : train.global_batch_sequences;
  if (train.seq_len > spec.max_seq_len) {
    throw Error(fmt::format("sequence length {} is longer than model {} allows ({})", train.seq_len, spec.name,
                            spec.max_seq_len),
                {train.source_path, "seq_len"}, fmt::format("use seq_len <= {}", spec.max_seq_len));
  }
  Data data = data_open(spec, train, o, batch);

  Arena arena(o.memory_cap_bytes > 0 ? static_cast<int64_t>(o.memory_cap_bytes) : (int64_t{64} << 30));
  Model model(spec, arena);
  model.recompute.assign(static_cast<size_t>(spec.num_layers), o.recompute);
  model_init_weights(model, train.seed);
  AdamWState optimizer(model);

  TrainerResult result;
  const std::string fingerprint = trainer_model_fingerprint(spec);
  if (o.resume) {
    if (o.checkpoint_dir.empty()) throw Error("--resume needs --checkpoint DIR", {"", "--resume"}, "name the checkpoint folder");
    CheckpointState state = checkpoint_load(o.checkpoint_dir, fingerprint, parameter_refs(model, model.params, ""),
                                            optimizer_refs(model, optimizer));
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
    checkpoint_save(o.checkpoint_dir, parameter_refs(model, model.params, ""),
                    optimizer_refs(model, optimizer), state);
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
    if (o.progress) print_progress(report, train.steps);
    if (on_step) on_step(report);
    result.steps.push_back(report);
  }
  result.peak_arena_bytes = arena.peak_bytes();
  return result;
}

}  // namespace alloy
