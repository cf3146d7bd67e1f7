// What the training loop writes for people and machines: the JSON-lines step log and the
// progress line; and the one-device plan of a run without one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/parallel/executor.hpp"
#include "runtime/trainer.hpp"
#include "spec/model.hpp"
#include "spec/train.hpp"

namespace alloy {

// Throws alloy::Error when train.seq_len exceeds what the model allows.
void trainer_check_seq_len(const ModelSpec& model, const TrainSpec& train);

// Appends one JSON object per step to `path` (nothing when empty): the step's figures and each
// rank's time and memory (its arena peak, and that peak by term as "peak_by_term"). Each line goes to the file whole or the write is an alloy::Error
// naming the file and the system's reason (a full disk, say).
class StepLog {
 public:
  explicit StepLog(const std::string& path);
  StepLog(const StepLog&) = delete;
  StepLog& operator=(const StepLog&) = delete;
  ~StepLog();
  void write(const StepReport& report, const std::vector<RankStepStats>* ranks = nullptr);

 private:
  std::string path_;
  int fd_ = -1;
};

// "step 12/100  loss 3.2101  lr ...  tok/s  mfu  peak" on stderr.
void trainer_print_progress(const StepReport& report, int64_t total_steps);

}  // namespace alloy
