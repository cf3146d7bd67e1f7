// Pieces both single-device trainers share (CPU: trainer.cpp, GPU: cuda/gpu_trainer.cpp):
// opening the token files, the JSON-lines step log and the progress line.
#pragma once

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "runtime/io/batch_loader.hpp"
#include "runtime/io/checkpoint.hpp"
#include "runtime/model.hpp"
#include "runtime/trainer.hpp"
#include "spec/model.hpp"
#include "spec/train.hpp"

namespace alloy {

struct TrainerData {
  BatchLoader train;
  std::optional<BatchLoader> val;  // sequential batches, when options.val_data is given
};

// Throws alloy::Error naming --data when no training file is given, or the file's problem.
// A data-parallel replica reads samples [sample_begin, sample_end) of each global batch.
TrainerData trainer_data_open(const ModelSpec& model, const TrainSpec& train, const TrainerOptions& options,
                              int64_t batch_sequences, int64_t sample_begin = 0, int64_t sample_end = -1);

// Throws alloy::Error when train.seq_len exceeds what the model allows.
void trainer_check_seq_len(const ModelSpec& model, const TrainSpec& train);

// Checkpoint views of a flat buffer laid out like model.params, named "<prefix><param>".
std::vector<TensorRef> trainer_parameter_refs(const Model& model, float* base, const std::string& prefix);
// The AdamW moments m and v (laid out like model.params): "adamw.m.<param>", "adamw.v.<param>".
std::vector<TensorRef> trainer_optimizer_refs(const Model& model, float* m, float* v);

// Appends one JSON object per step to options.log_path (nothing when empty).
class StepLog {
 public:
  explicit StepLog(const std::string& path);
  void write(const StepReport& report);

 private:
  std::ofstream out_;
};

// "step 12/100  loss 3.2101  lr ...  tok/s  mfu  peak" on stderr.
void trainer_print_progress(const StepReport& report, int64_t total_steps);

}  // namespace alloy
