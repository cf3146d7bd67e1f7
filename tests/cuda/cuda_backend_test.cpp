// The CUDA backend under the one training loop (train_run over a one-stage plan, as `alloy train
// --device cuda` runs it): its step and validation losses follow the CPU backend's with the batch
// in two micro-batches under GPipe (both passes alive at once), and a run resumed from a
// checkpoint continues where the uninterrupted run was.
#include <gtest/gtest.h>

#include <string>

#include "../common/test_util.hpp"
#include "cuda_test_util.hpp"
#include "hw/catalog.hpp"
#include "runtime/cuda/cuda_backend.hpp"
#include "runtime/io/tokenize.hpp"
#include "runtime/trainer.hpp"
#include "spec/model.hpp"

namespace alloy {
namespace cuda_backend_test {

constexpr const char* kModel = R"(name: backend-test-gpt
family: gpt2
layers: 2
hidden_size: 128
heads: 2
ffn_hidden_size: 512
vocab_size: 300
max_seq_len: 96
)";

class CudaBackendTrainer : public ::testing::Test {
 protected:
  void SetUp() override {
    ALLOY_REQUIRE_GPU();
    const std::string text = std::string(ALLOY_SOURCE_DIR) + "/examples/data/fsf_licenses.txt";
    const TokenizeResult data = tokenize_bytes(text, dir.path() + "/data.bin", 0.1);
    spec = model_load_file(dir.write("model.yaml", kModel));
    train.steps = 12;
    train.seq_len = 64;
    train.global_batch_sequences = 8;
    train.learning_rate = 1e-3;
    train.warmup_steps = 2;
    options.train_data = data.train_path;
    options.progress = false;
    options.threads = 2;
  }

  // `micro_batches` micro-batches per step under `schedule`, on GPU 0.
  TrainerResult run_on_gpu(const TrainerOptions& o, int micro_batches, Schedule schedule) {
    TrainSpec gpu_train = train;
    gpu_train.precision = Precision::Precision_bf16;
    TrainerOptions capped = o;
    capped.memory_cap_bytes = static_cast<double>(int64_t{4} << 30);
    OneStage one = trainer_one_stage(spec, gpu_train, capped, catalog_builtin().find("h200"));
    one.plan.micro_batch_sequences = one.plan.global_batch_sequences / micro_batches;
    one.plan.num_micro_batches = micro_batches;
    one.plan.schedule = schedule;
    const CudaStream stream;
    TrainBackend backend;
    backend.name = "cuda";
    backend.make = [s = stream.get()](const StageRequest& r) { return stage_backend_cuda(r, 0, s); };
    std::unique_ptr<Communicator> comm = communicator_local();
    return train_run(spec, gpu_train, one.plan, one.cluster, *comm, capped, backend);
  }

  testing::TempDir dir;
  ModelSpec spec;
  TrainSpec train;
  TrainerOptions options;
};

TEST_F(CudaBackendTrainer, LossesFollowTheCpuBackend) {
  options.val_data = tokenize_split_path(dir.path() + "/data.bin", "val");
  options.val_every = 6;
  options.val_batches = 2;
  const TrainerResult cpu = trainer_run(spec, train, options);
  const TrainerResult gpu = run_on_gpu(options, 2, Schedule::Schedule_gpipe);
  ASSERT_EQ(gpu.steps.size(), cpu.steps.size());
  for (size_t i = 0; i < cpu.steps.size(); ++i) {
    EXPECT_NEAR(gpu.steps[i].loss, cpu.steps[i].loss, 0.02 * cpu.steps[i].loss) << "step " << i + 1;
  }
  // From the same weights the two differ only by bf16 rounding; later steps also by their paths.
  EXPECT_NEAR(gpu.steps[0].grad_norm, cpu.steps[0].grad_norm, 0.05 * cpu.steps[0].grad_norm);
  EXPECT_LT(gpu.steps.back().loss, gpu.steps.front().loss - 0.5);
  ASSERT_TRUE(gpu.initial_val_loss && gpu.final_val_loss && cpu.initial_val_loss && cpu.final_val_loss);
  EXPECT_NEAR(*gpu.initial_val_loss, *cpu.initial_val_loss, 0.01 * *cpu.initial_val_loss);
  EXPECT_NEAR(*gpu.final_val_loss, *cpu.final_val_loss, 0.02 * *cpu.final_val_loss);
  EXPECT_GT(gpu.gemm_peak_flops, 0);
}

TEST_F(CudaBackendTrainer, ResumeContinuesFromTheCheckpoint) {
  train.warmup_steps = 0;
  train.min_learning_rate = train.learning_rate;  // a constant rate: the shorter run's schedule is the same
  const TrainerResult straight = run_on_gpu(options, 1, Schedule::Schedule_1f1b);
  options.checkpoint_dir = dir.path() + "/checkpoint";
  train.steps = 6;
  run_on_gpu(options, 1, Schedule::Schedule_1f1b);
  options.resume = true;
  train.steps = 12;
  const TrainerResult resumed = run_on_gpu(options, 1, Schedule::Schedule_1f1b);
  ASSERT_EQ(resumed.first_step, 6);
  ASSERT_EQ(resumed.steps.size(), 6u);
  // Not bit for bit: the attention backward's atomics order differently from run to run. From
  // the initial weights (a bf16 copy not refreshed after loading) the loss would be ~5.6.
  for (size_t i = 0; i < resumed.steps.size(); ++i) {
    EXPECT_NEAR(resumed.steps[i].loss, straight.steps[6 + i].loss, 0.01 * straight.steps[6 + i].loss)
        << "step " << resumed.steps[i].step;
  }
}

}  // namespace cuda_backend_test
}  // namespace alloy
