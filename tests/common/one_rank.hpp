// What `alloy train` without a plan runs each step, for tests that drive steps themselves: the
// executor of one rank over the one-stage plan of a model, on the CPU backend.
#pragma once

#include <memory>

#include "runtime/parallel/communicator.hpp"
#include "runtime/parallel/executor.hpp"
#include "runtime/trainer.hpp"

namespace alloy::testing {

struct OneRankStep {
  float loss = 0;      // mean cross-entropy
  float aux_loss = 0;  // MoE models: the load-balancing loss (unweighted)
  float grad_norm = 0;
  float learning_rate = 0;
};

class OneRank {
 public:
  // B sequences of train.seq_len tokens per step, in one micro-batch; `recompute` on every block.
  OneRank(const ModelSpec& model, TrainSpec train, int B, Recompute recompute = Recompute::Recompute_none,
          int64_t memory_bytes = int64_t{1} << 30)
      : train_(with_batch(train, B)), one_(one_stage(model, train_, B, recompute)), comm_(communicator_local()) {
    RankResources resources;
    resources.memory_cap_bytes = memory_bytes;
    runtime_ = std::make_unique<RankRuntime>(one_.plan, model, train_, *comm_, resources);
  }

  Model& model() { return runtime_->model(); }
  RankRuntime& runtime() { return *runtime_; }

  // inputs, targets: (B, T) token ids.
  OneRankStep step(const int32_t* inputs, const int32_t* targets) {
    const RankStepStats stats = runtime_->step(inputs, targets);
    return {static_cast<float>(stats.loss_sum / stats.loss_tokens), static_cast<float>(stats.aux_loss_sum / stats.loss_tokens),
            static_cast<float>(stats.grad_norm), static_cast<float>(stats.learning_rate)};
  }

 private:
  static TrainSpec with_batch(TrainSpec train, int B) {
    train.global_batch_sequences = B;
    return train;
  }
  static OneStage one_stage(const ModelSpec& model, const TrainSpec& train, int B, Recompute recompute) {
    TrainerOptions options;
    options.batch_size = B;
    options.recompute = recompute;
    return trainer_one_stage(model, train, options);
  }
  TrainSpec train_;
  OneStage one_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<RankRuntime> runtime_;
};

}  // namespace alloy::testing
