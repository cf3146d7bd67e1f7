// TrainSpec: what the user wants from one training run (sequence length, global batch,
// precision, optimizer and its schedule). Read from YAML; defaults are documented in docs/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "spec/device_type.hpp"

namespace alloy {

// Dynamic loss scaling multiplies the loss by a scale before the backward and divides the
// gradients by it before the update, so that fp16 gradients neither underflow nor overflow;
// on overflow the step is skipped and the scale halved, after `loss_scale_growth_interval`
// good steps it doubles. auto: on where a rank computes in fp16.
enum class LossScaling { LossScaling_auto, LossScaling_none, LossScaling_dynamic };
const char* loss_scaling_name(LossScaling scaling);

struct TrainSpec {
  std::string source_path;
  int64_t seq_len = 1024;
  int64_t global_batch_sequences = 8;   // sequences per optimizer step
  int64_t min_global_batch = 0;         // > 0: the planner may choose the batch in [min, max]
  int64_t max_global_batch = 0;
  Precision precision = Precision::Precision_bf16;  // compute precision
  bool master_weights_fp32 = true;      // mixed precision keeps fp32 master weights
  std::string optimizer = "adamw";      // adamw (2 states) or sgd (momentum, 1 state)

  // Optimizer schedule, used by `alloy train`.
  int64_t steps = 100;
  double learning_rate = 3e-4;
  double min_learning_rate = 3e-5;
  int64_t warmup_steps = 10;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double adam_eps = 1e-8;
  double grad_clip = 1.0;               // global norm; 0 disables clipping
  // Target size of a data-parallel gradient bucket (whole blocks, so at least one block): the
  // unit of overlapped reduction; with sharded gradients, the largest part (fp32) of a bucket
  // held while it is written and reduce-scattered.
  double gradient_bucket_mib = 64.0;
  // What ZeRO 2-3 gradient reductions send: fp32, or bf16 (half the bytes, summed in fp32 by
  // each piece's owner). ZeRO 0-1 all-reduces send the gradients as they are.
  Precision gradient_communication = Precision::Precision_fp32;
  LossScaling loss_scaling = LossScaling::LossScaling_auto;
  double initial_loss_scale = 65536;        // 2^16, as PyTorch's GradScaler
  int64_t loss_scale_growth_interval = 2000;  // good steps before the scale doubles
  uint64_t seed = 1234;
  // Mixture-of-Experts routing as measured: top-k picks of each routed expert (E values, or
  // layers x E as `alloy train`'s step log writes `expert_tokens`, summed per expert), for the
  // planner's expert load and placement. Empty: uniform routing is assumed.
  std::vector<double> expert_tokens;
};

// Number of optimizer state tensors per parameter (Adam: 2 moments; SGD: 1 momentum).
int train_optimizer_states(const TrainSpec& train);

// Reads a YAML file; `global_batch_tokens` may replace `global_batch` (must divide by seq_len).
TrainSpec train_load(const std::string& path);
// The same for YAML in memory; `path` names it in errors.
TrainSpec train_load_text(const std::string& text, const std::string& path);
// Every field: train_load_text(train_to_yaml(t), ...) equals t (but for source_path).
std::string train_to_yaml(const TrainSpec& train);
void train_validate(const TrainSpec& train);

}  // namespace alloy
