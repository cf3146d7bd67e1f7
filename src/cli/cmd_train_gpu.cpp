// `alloy train --device cuda`: one GPU, with a plan's micro-batching and recomputation when
// given one, and the plan's predicted step time and memory set against what the run measured.
#include "cli/gpu_commands.hpp"

#include <algorithm>

#include <fmt/core.h>

#include "spec/error.hpp"

#ifdef ALLOY_WITH_CUDA
#include "hw/catalog.hpp"
#include "plan/plan.hpp"
#include "runtime/dist/communicator.hpp"
#include "runtime/dist/dist_trainer.hpp"
#include "runtime/cuda/gpu_trainer.hpp"
#include "spec/units.hpp"
#endif

namespace alloy::cli {

#ifdef ALLOY_WITH_CUDA

namespace {

// The plan's batch, micro-batches and per-layer recomputation, once it is known to be a plan
// the GPU runtime can run: one stage, data parallel only, as many ranks as the plan's devices.
const PlanStage& plan_apply(const Plan& plan, const ModelSpec& model, TrainSpec& train, GpuTrainerOptions& o,
                            int ranks, const std::string& path) {
  const PlanStage& stage = plan.stages.front();
  if (plan.stages.size() != 1 || stage.tp != 1 || stage.zero != 0) {
    throw Error(fmt::format("the plan has {} stage(s), tp {} and ZeRO {}; the GPU runtime runs one-stage, "
                            "data-parallel plans without ZeRO so far",
                            plan.stages.size(), stage.tp, stage.zero),
                {path, "stages"}, "plan with alloy plan --pp 1 --tp 1 --zero 0, or run the plan on CPU ranks");
  }
  if (plan.num_used_devices() != ranks) {
    throw Error(fmt::format("the plan uses {} GPU(s) but {} rank(s) were started", plan.num_used_devices(), ranks),
                {path, "stages"}, fmt::format("start one rank per GPU: mpirun -np {} alloy train ...", plan.num_used_devices()));
  }
  if (!stage.replicas.empty()) {
    throw Error("the plan splits micro-batches unevenly over its replicas, which the GPU runtime does not run yet",
                {path, "stages[0].replicas"}, "re-plan with alloy plan --even-dp, or run the plan on CPU ranks");
  }
  for (const std::vector<bool>* flags : {&stage.offload, &stage.offload_activations}) {
    if (std::find(flags->begin(), flags->end(), true) != flags->end()) {
      throw Error("the plan offloads layers to host memory, which the GPU runtime does not run yet",
                  {path, flags == &stage.offload ? "stages[0].offload" : "stages[0].offload_activations"},
                  "re-plan with alloy plan --no-offload, or run the plan on CPU ranks");
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
  o.micro_batch_sequences = plan.micro_batch_sequences / stage.dp;
  o.layer_recompute = stage.recompute;
  return stage;
}

// Data parallelism under mpirun: the GPU of each rank and the gradients' path.
void data_parallel_setup(Communicator& mpi, const GpuTrainRequest& request, GpuTrainerOptions& o) {
  if (!o.common.val_data.empty() && mpi.world_size() > 1) {
    throw Error("validation runs on one rank only", {"", "--val-data"}, "drop --val-data under mpirun");
  }
  const int gpus = cuda_device_count();
  const int local_rank = mpi.rank() % mpi.local_size();
  o.mpi = &mpi;
  o.device = request.gpu >= 0 ? request.gpu : (gpus > 0 ? local_rank % gpus : 0);
  const bool shared = mpi.local_size() > gpus;
  if (request.gradient_path == "nccl" || (request.gradient_path == "auto" && !shared)) {
    if (shared) {
      throw Error(fmt::format("{} ranks on host {} share {} GPU(s), and NCCL needs a GPU per rank", mpi.local_size(),
                              mpi.host_name(), gpus),
                  {"", "--gpu-comm"}, "start one rank per GPU, or use --gpu-comm host");
    }
    o.gradient_path = GpuGradientPath::GpuGradientPath_nccl;
  } else if (request.gradient_path == "host" || request.gradient_path == "auto") {
    o.gradient_path = GpuGradientPath::GpuGradientPath_host_staged;
    if (mpi.rank() == 0 && shared) {
      fmt::print("{} ranks share {} GPU(s) on {}: gradients go through host memory (slow; start one rank per GPU for NCCL)\n",
                 mpi.local_size(), gpus, mpi.host_name());
    }
  } else {
    throw Error("unknown gradient path '" + request.gradient_path + "'", {"", "--gpu-comm"}, "use auto, nccl or host");
  }
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
  // Per GPU, against one GPU's peak.
  const double model_flops = tokens_per_second * model_flops_per_token(model, train.seq_len).training / r.replicas;
  fmt::print("\ntrained {} on {} ({}) for steps {}..{}: loss {:.4f} -> {:.4f}\n", model.name, r.device.name,
             units_format_bytes(static_cast<double>(r.device.memory_bytes)), run.first_step + 1, run.steps.back().step,
             run.steps.front().loss, run.steps.back().loss);
  if (run.final_val_loss) fmt::print("validation loss {:.4f}\n", *run.final_val_loss);
  fmt::print("median step {:.2f} ms over {} replica(s) x {} micro-batch(es) of {} x {} tokens: {:.0f} tokens/s\n",
             1e3 * r.median_step_seconds, r.replicas, r.micro_batches,
             train.global_batch_sequences / (r.micro_batches * r.replicas), train.seq_len, tokens_per_second);
  fmt::print("model FLOPs utilisation {:.1f}% of the measured bf16 GEMM peak ({})", 100.0 * model_flops / run.gemm_peak_flops,
             units_format_flops(run.gemm_peak_flops));
  if (r.datasheet_peak_flops > 0) {
    fmt::print(", {:.1f}% of the datasheet's ({})", 100.0 * model_flops / r.datasheet_peak_flops,
               units_format_flops(r.datasheet_peak_flops));
  }
  fmt::print("\npeak GPU arena memory {}\n", units_format_bytes(static_cast<double>(run.peak_arena_bytes)));
  if (plan == nullptr) return;
  const double predicted_memory = dist_predicted_arena_bytes(stage->memory);
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
  o.device = std::max(request.gpu, 0);
  train.precision = Precision::Precision_bf16;
  std::unique_ptr<Communicator> mpi = communicator_launched_by_mpi() ? communicator_mpi() : nullptr;
  const bool lead = mpi == nullptr || mpi->rank() == 0;
  try {
    if (mpi) data_parallel_setup(*mpi, request, o);
    if (!lead) o.common.progress = false;
    Plan plan;
    const PlanStage* stage = nullptr;
    if (!request.plan_path.empty()) {
      plan = plan_load(request.plan_path);
      const ClusterSpec cluster =
          cluster_load(request.cluster.empty() ? plan.cluster_name : request.cluster, catalog_builtin());
      plan_validate_for(plan, model, cluster, request.plan_path);
      stage = &plan_apply(plan, model, train, o, mpi ? mpi->world_size() : 1, request.plan_path);
    }
    const GpuTrainerResult r = gpu_trainer_run(model, train, o);
    if (lead) print_gpu_summary(model, train, r, stage != nullptr ? &plan : nullptr, stage);
  } catch (const Error& e) {
    if (!mpi) throw;
    mpi->abort(e.format(), kExitBadInput);  // the other ranks may wait in a collective
  }
}

#else

void train_on_gpu(const ModelSpec&, TrainSpec, const GpuTrainRequest&) {
  throw Error("this alloy was built without the CUDA backend", {"", "--device"},
              "rebuild with scripts/build.sh cuda (needs nvcc, cuBLAS and NCCL), or train on CPUs with --device cpu");
}

#endif

}  // namespace alloy::cli
