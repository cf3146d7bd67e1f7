// Token files, step log and progress line shared by the CPU and GPU trainers.
#include "runtime/trainer_common.hpp"

#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/io/token_file.hpp"
#include "spec/error.hpp"
#include "spec/units.hpp"

namespace alloy {

TrainerData trainer_data_open(const ModelSpec& model, const TrainSpec& train, const TrainerOptions& o,
                              int64_t batch, int64_t sample_begin, int64_t sample_end) {
  if (o.train_data.empty()) {
    throw Error("no training data given", {"", "--data"}, "pass --data FILE.bin (make one with `alloy tokenize`)");
  }
  BatchLoaderOptions lo;
  lo.batch_size = batch;
  lo.seq_len = train.seq_len;
  lo.seed = train.seed;
  lo.sample_begin = sample_begin;
  lo.sample_end = sample_end;
  TrainerData d{batch_loader_create(token_file_open(o.train_data, model.vocab_size), lo), std::nullopt};
  if (!o.val_data.empty()) {
    BatchLoaderOptions vo = lo;
    vo.sampling = BatchSampling::BatchSampling_sequential;
    d.val = batch_loader_create(token_file_open(o.val_data, model.vocab_size), vo);
  }
  return d;
}

void trainer_check_seq_len(const ModelSpec& spec, const TrainSpec& train) {
  if (train.seq_len > spec.max_seq_len) {
    throw Error(fmt::format("sequence length {} is longer than model {} allows ({})", train.seq_len, spec.name,
                            spec.max_seq_len),
                {train.source_path, "seq_len"}, fmt::format("use seq_len <= {}", spec.max_seq_len));
  }
}

std::vector<TensorRef> trainer_parameter_refs(const Model& model, float* base, const std::string& prefix) {
  std::vector<TensorRef> refs;
  refs.reserve(model.views.size());
  for (const auto& v : model.views) refs.push_back({prefix + v.name, v.shape, base + v.offset});
  return refs;
}

std::vector<TensorRef> trainer_optimizer_refs(const Model& model, float* m, float* v) {
  std::vector<TensorRef> refs = trainer_parameter_refs(model, m, "adamw.m.");
  for (auto& r : trainer_parameter_refs(model, v, "adamw.v.")) refs.push_back(std::move(r));
  return refs;
}

StepLog::StepLog(const std::string& path) {
  if (path.empty()) return;
  out_.open(path, std::ios::app);
  if (!out_) throw Error("cannot open the log file for writing", {path, "--log"}, "check the folder exists and is writable");
}

void StepLog::write(const StepReport& r) {
  if (!out_.is_open()) return;
  nlohmann::json j = {{"step", r.step},       {"loss", r.loss},
                      {"lr", r.learning_rate}, {"grad_norm", r.grad_norm},
                      {"step_seconds", r.step_seconds}, {"tokens_per_second", r.tokens_per_second},
                      {"mfu", r.mfu},         {"peak_arena_bytes", r.peak_arena_bytes}};
  if (r.val_loss) j["val_loss"] = *r.val_loss;
  out_ << j.dump() << "\n";
  out_.flush();
}

void trainer_print_progress(const StepReport& r, int64_t total_steps) {
  std::string line = fmt::format("step {:>5}/{}  loss {:.4f}  lr {:.2e}  gnorm {:.3f}  {:.0f} tok/s  mfu {:.1f}%  peak {}",
                                 r.step, total_steps, r.loss, r.learning_rate, r.grad_norm, r.tokens_per_second,
                                 100.0 * r.mfu, units_format_bytes(static_cast<double>(r.peak_arena_bytes)));
  if (r.val_loss) line += fmt::format("  val {:.4f}", *r.val_loss);
  std::fprintf(stderr, "%s\n", line.c_str());
}

}  // namespace alloy
