// What each backend runs of a plan, answered from the plan alone so that a build without a GPU
// answers for the CUDA backend too, and a plan is refused before anything is allocated.
#include "runtime/stage_backend.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "spec/error.hpp"
#include "spec/moe.hpp"

namespace alloy {

namespace {

StageSupport refuse(std::string feature, std::string field, std::string reason) {
  return {false, std::move(feature), std::move(field), std::move(reason)};
}

// The CPU backend runs every feature the executor has, within the limits the planner shares.
StageSupport cpu_supports(const Plan& plan, int s) {
  return stage_features_runnable(stage_layout_of(plan, s));
}

// The CUDA backend runs pipeline stages (interleaved chunks too) of whole layers, with data
// parallelism (even or uneven shares) and ZeRO 1-2 between replicas, gradients kept in full
// (ZeRO 2 reduce-scatters them once per step).
StageSupport cuda_supports(const Plan& plan, int s) {
  const PlanStage& st = plan.stages[static_cast<size_t>(s)];
  const std::string why = "the cuda backend runs pipeline stages of whole layers with data parallelism and ZeRO 1-2 "
                          "so far; run this plan on CPU ranks (--device cpu), or re-plan";
  if (st.tp > 1) return refuse(fmt::format("tensor parallelism (tp {})", st.tp), fmt::format("stages[{}].tp", s), why + " with --tp 1");
  if (st.sequence_parallel)
    return refuse("sequence parallelism", fmt::format("stages[{}].sequence_parallel", s), why + " with --tp 1");
  if (st.zero > 2 && st.dp > 1)
    return refuse(fmt::format("ZeRO stage {}", st.zero), fmt::format("stages[{}].zero", s), why + " with --zero 2");
  if (st.gradients_sharded())
    return refuse("sharded gradients", fmt::format("stages[{}].shard_gradients", s), why + " with --gradients full");
  if (flags_any(st.offload))
    return refuse("weight offload to host memory", fmt::format("stages[{}].offload", s), why + " with --no-offload");
  if (flags_any(st.offload_activations))
    return refuse("activation offload to host memory", fmt::format("stages[{}].offload_activations", s),
                  why + " without --offload-activations");
  return {};
}

// What a plan asks of an MoE model that the runtime does not run: MoE blocks train on CPU ranks
// with every layout the dense models have, and on GPU ranks as whole models with data and expert
// parallelism (cuda_supports answers for the rest).
StageSupport moe_plan_supported(const std::string& name, const ModelSpec& model, const Plan& plan) {
  const std::string why = "Mixture-of-Experts models train on CPU ranks with pipeline, tensor, data and expert "
                          "parallelism, ZeRO 0-3, recomputation, weight and activation offload and uneven shares in "
                          "one piece each so far";
  if (name == "cuda" && model.moe.num_shared_experts > 0 && model.moe.shared_expert_gate)
    return refuse("the shared experts' sigmoid gate on the cuda backend", "--device",
                  "the cuda backend runs MoE blocks without the shared-expert gate so far; use --device cpu");
  if (name != "cpu" && name != "cuda")
    return refuse(fmt::format("the {} backend", name), "--device", why + "; use --device cpu");
  if (name == "cuda" && (plan.stages.size() > 1 || plan.virtual_chunks > 1))
    return refuse(fmt::format("pipeline parallelism ({} stages{}) on the cuda backend", plan.stages.size(),
                              plan.virtual_chunks > 1 ? fmt::format(" of {} chunks", plan.virtual_chunks) : ""),
                  "stages", "the cuda backend runs MoE models in one pipeline stage so far; re-plan with --pp 1 or use --device cpu");
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const PlanStage& st = plan.stages[s];
    // Every replica's MoE blocks meet the others' in collectives once per micro-batch.
    const bool pieces = std::any_of(st.replicas.begin(), st.replicas.end(), [](const PlanReplica& r) { return r.pieces > 1; });
    if (pieces)
      return refuse("a data-parallel share run in several pieces", fmt::format("stages[{}].replicas", s),
                    why + "; give every replica pieces: 1");
  }
  return {};
}

}  // namespace

void stage_backend_check_moe(const std::string& name, const ModelSpec& model, const Plan& plan,
                             const std::string& source) {
  if (!model_is_moe(model) || plan.stages.empty()) return;
  const StageSupport support = moe_plan_supported(name, model, plan);
  if (support.ok) return;
  throw Error(fmt::format("Mixture-of-Experts model {} ({}) with {} is not supported", model.name,
                          moe_summary(model.moe), support.feature),
              {source, support.field}, support.reason);
}

std::vector<double> StageBackend::pass_balance_sums(const StagePass& /*pass*/) {
  throw Error(fmt::format("the {} backend trains no Mixture-of-Experts model", name()));
}

void StageBackend::pass_balance_pool(StagePass& /*pass*/, const double* /*sums*/) {
  throw Error(fmt::format("the {} backend trains no Mixture-of-Experts model", name()));
}

StageSupport stage_backend_supports(const std::string& name, const Plan& plan, int stage) {
  if (stage < 0 || stage >= static_cast<int>(plan.stages.size()))
    return refuse(fmt::format("stage {}", stage), "stages", fmt::format("the plan has {} stages", plan.stages.size()));
  if (name == "cpu") return cpu_supports(plan, stage);
  if (name == "cuda") return cuda_supports(plan, stage);
  return refuse(fmt::format("backend '{}'", name), "", "Alloy's backends are cpu and cuda");
}

std::string stage_backend_precision_note(const std::string& name, Precision asked, const std::string& source) {
  if (name != "cuda" || asked == Precision::Precision_bf16) return "";
  return fmt::format("note: the cuda backend computes in bf16 with fp32 master weights; {} names {}, so this run's "
                     "times and memory are bf16's, not {}'s (write `precision: bf16` to plan and run the same thing)",
                     source, precision_name(asked), precision_name(asked));
}

void stage_backend_check_plan(const std::string& name, const Plan& plan, const std::string& source) {
  for (int s = 0; s < static_cast<int>(plan.stages.size()); ++s) {
    const StageSupport support = stage_backend_supports(name, plan, s);
    if (support.ok) continue;
    throw Error(fmt::format("stage {} asks for {}, which the {} backend does not run", s, support.feature, name),
                {source, support.field}, support.reason);
  }
}

}  // namespace alloy
