// The single-rank training loop behind `alloy train`: batches from token files, train steps,
// validation every N steps, progress for people and JSON lines for machines, checkpoints with
// exact resume.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "runtime/activation_memory.hpp"
#include "spec/model.hpp"
#include "spec/train.hpp"

namespace alloy {

struct TrainerOptions {
  std::string train_data;            // llm.c token file
  std::string val_data;              // optional; validation loss every val_every steps
  int64_t batch_size = 0;            // sequences per step; 0: the TrainSpec's global batch
  int64_t val_every = 0;             // 0: only at the end (when val_data is given)
  int64_t val_batches = 4;           // batches per validation pass
  std::string checkpoint_dir;        // empty: no checkpoints
  int64_t checkpoint_every = 0;      // 0: only at the end
  bool resume = false;               // continue from checkpoint_dir
  std::string log_path;              // JSON lines, one per step (and per validation)
  int threads = 0;                   // 0: runtime_default_threads()
  Recompute recompute = Recompute::Recompute_none;  // for every block
  double memory_cap_bytes = 0;       // arena capacity; 0: 64 GiB
  bool progress = true;              // progress line on stderr
};

struct StepReport {
  int64_t step = 0;               // 1-based optimizer step just completed
  double loss = 0;
  double learning_rate = 0;
  double grad_norm = 0;
  double step_seconds = 0;
  double tokens_per_second = 0;
  double mfu = 0;                 // model FLOPs / (step time x measured GEMM peak)
  int64_t peak_arena_bytes = 0;
  std::optional<double> val_loss; // when this step ran a validation pass
};

struct TrainerResult {
  int64_t first_step = 0;         // 0, or the checkpoint's step when resumed
  std::vector<StepReport> steps;
  std::optional<double> initial_val_loss;
  std::optional<double> final_val_loss;
  double gemm_peak_flops = 0;     // measured at start, the MFU denominator
  int64_t peak_arena_bytes = 0;
};

// Runs train.steps optimizer steps (from the checkpoint's step when resuming). `on_step` sees
// each report as it is made. Throws alloy::Error for bad data, checkpoints or memory.
TrainerResult trainer_run(const ModelSpec& model, const TrainSpec& train, const TrainerOptions& options,
                          const std::function<void(const StepReport&)>& on_step = {});

// Identifies a model architecture in checkpoints: name plus a hash of every size and flag.
std::string trainer_model_fingerprint(const ModelSpec& model);

}  // namespace alloy
