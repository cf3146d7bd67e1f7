// `alloy train --device cuda`: one GPU, with a plan's micro-batching and recomputation when
// given one, and the plan's predicted step time and memory set against what the run measured.
#include "cli/gpu_commands.hpp"

#include <fmt/core.h>

#include "spec/error.hpp"

#ifdef ALLOY_WITH_CUDA
#include "hw/catalog.hpp"
#include "plan/plan.hpp"
#include "runtime/dist/dist_trainer.hpp"
#include "runtime/cuda/gpu_trainer.hpp"
#include "spec/units.hpp"
#endif

namespace alloy::cli {

#ifdef ALLOY_WITH_CUDA

namespace {

// The plan's batch, micro-batches and per-layer recomputation, once it is known to be a plan
// the GPU runtime can run.
const PlanStage& plan_apply(const Plan& plan, const ModelSpec& model, TrainSpec& train, GpuTrainerOptions& o,
                            const std::string& path) {
  if (plan.num_used_devices() != 1 || plan.stages.size() != 1) {
    throw Error(fmt::format("the plan uses {} devices in {} stages; the GPU runtime runs one-GPU plans so far",
                            plan.num_used_devices(), plan.stages.size()),
                {path, "stages"},
                "plan for a cluster of one GPU, or run multi-device plans on CPU ranks under mpirun");
  }
  const PlanStage& stage = plan.stages.front();
  for (bool offloaded : stage.offload) {
    if (offloaded) {
      throw Error("the plan offloads layers to host memory, which the GPU runtime does not run yet", {path, "offload"},
                  "re-plan with alloy plan --no-offload");
    }
  }
  if (plan.num_layers != model.num_layers) {
    throw Error(fmt::format("the plan is for {} layers but model {} has {}", plan.num_layers, model.name,
                            model.num_layers),
                {path, "num_layers"}, "plan for this model, or pass the plan's model");
  }
  train.seq_len = plan.seq_len;
  train.global_batch_sequences = plan.global_batch_sequences;
  o.common.batch_size = plan.global_batch_sequences;
  o.micro_batch_sequences = plan.micro_batch_sequences;
  o.layer_recompute = stage.recompute;
  return stage;
}

void print_gpu_summary(const ModelSpec& model, const TrainSpec& train, const GpuTrainerResult& r, const Plan* plan,
                       const PlanStage* stage) {
  const TrainerResult& run = r.run;
  if (run.steps.empty()) {
    fmt::print("nothing to do: the checkpoint is already at step {} of {}\n", run.first_step, train.steps);
    return;
  }
  const double step_tokens = static_cast<double>(train.global_batch_sequences) * static_cast<double>(train.seq_len);
  const double tokens_per_second = step_tokens / r.median_step_seconds;
  const double model_flops = tokens_per_second * model_flops_per_token(model, train.seq_len).training;
  fmt::print("\ntrained {} on {} ({}) for steps {}..{}: loss {:.4f} -> {:.4f}\n", model.name, r.device.name,
             units_format_bytes(static_cast<double>(r.device.memory_bytes)), run.first_step + 1, run.steps.back().step,
             run.steps.front().loss, run.steps.back().loss);
  if (run.final_val_loss) fmt::print("validation loss {:.4f}\n", *run.final_val_loss);
  fmt::print("median step {:.2f} ms over {} micro-batch(es) of {} x {} tokens: {:.0f} tokens/s\n",
             1e3 * r.median_step_seconds, r.micro_batches, train.global_batch_sequences / r.micro_batches,
             train.seq_len, tokens_per_second);
  fmt::print("model FLOPs utilisation {:.1f}% of the measured bf16 GEMM peak ({})", 100.0 * model_flops / run.gemm_peak_flops,
             units_format_flops(run.gemm_peak_flops));
  if (r.datasheet_peak_flops > 0) {
    fmt::print(", {:.1f}% of the datasheet's ({})", 100.0 * model_flops / r.datasheet_peak_flops,
               units_format_flops(r.datasheet_peak_flops));
  }
  fmt::print("\npeak GPU arena memory {}\n", units_format_bytes(static_cast<double>(run.peak_arena_bytes)));
  if (plan == nullptr) return;
  const double predicted_memory = dist_predicted_arena_bytes(*stage);
  fmt::print("\n{:<22}{:>14}{:>14}{:>12}\n", "plan vs run", "predicted", "measured", "ratio");
  fmt::print("{:<22}{:>11.2f} ms{:>11.2f} ms{:>12.3f}\n", "step time", 1e3 * plan->step_seconds,
             1e3 * r.median_step_seconds, r.median_step_seconds / plan->step_seconds);
  fmt::print("{:<22}{:>14}{:>14}{:>12.3f}\n", "peak memory", units_format_bytes(predicted_memory),
             units_format_bytes(static_cast<double>(run.peak_arena_bytes)),
             static_cast<double>(run.peak_arena_bytes) / predicted_memory);
  fmt::print("(memory: the GPU arena's peak against the plan's per-device memory without the framework context and "
             "allocator margin, which are not in the arena)\n");
}

}  // namespace

void train_on_gpu(const ModelSpec& model, TrainSpec train, const GpuTrainRequest& request) {
  GpuTrainerOptions o;
  o.common = request.options;
  o.device = request.gpu;
  train.precision = Precision::Precision_bf16;
  Plan plan;
  const PlanStage* stage = nullptr;
  if (!request.plan_path.empty()) {
    plan = plan_load(request.plan_path);
    const ClusterSpec cluster =
        cluster_load(request.cluster.empty() ? plan.cluster_name : request.cluster, catalog_builtin());
    plan_validate_for(plan, model, cluster, request.plan_path);
    stage = &plan_apply(plan, model, train, o, request.plan_path);
  }
  const GpuTrainerResult r = gpu_trainer_run(model, train, o);
  print_gpu_summary(model, train, r, stage != nullptr ? &plan : nullptr, stage);
}

#else

void train_on_gpu(const ModelSpec&, TrainSpec, const GpuTrainRequest&) {
  throw Error("this alloy was built without the CUDA backend", {"", "--device"},
              "rebuild with scripts/build.sh cuda (needs nvcc, cuBLAS and NCCL), or train on CPUs with --device cpu");
}

#endif

}  // namespace alloy::cli
