// `alloy plan` and `alloy explain`: search the fastest layout that fits and print why it won;
// print the full breakdown of a saved plan.
#include <optional>

#include <fmt/core.h>

#include "cli/commands.hpp"
#include "cli/option_checks.hpp"
#include "cli/search_flags.hpp"
#include "cost/profile.hpp"
#include "hw/catalog.hpp"
#include "plan/export.hpp"
#include "plan/plan_inputs.hpp"
#include "search/explain.hpp"
#include "search/planner.hpp"
#include "sim/report.hpp"
#include "sim/simulate.hpp"
#include "spec/error.hpp"
#include "spec/units.hpp"

namespace alloy::cli {

namespace {

struct PlanCommand {
  std::string model;
  std::string cluster;
  std::string train;
  std::string output;
  std::string report;
  std::string emit;
  int64_t global_batch = 0;
  SearchFlags flags;
};

void run_plan(PlanCommand& c) {
  ModelSpec model = model_load(c.model);
  ClusterSpec cluster = cluster_load(c.cluster, catalog_builtin());
  TrainSpec train;
  if (!c.train.empty()) train = train_load(c.train);
  if (c.global_batch > 0) train.global_batch_sequences = c.global_batch;
  train_validate(train);
  const std::optional<Profile> profile = search_flags_profile(c.flags);
  CostModel cost(model, cluster, train, profile ? &*profile : nullptr);
  SearchResult result = search_flags_run(cost, c.flags);
  if (!c.output.empty()) {
    plan_set_inputs(&result.plan, model, cluster, train);
    plan_save(result.plan, c.output);
    fmt::print("plan written to {}\n", c.output);
  }
  if (c.emit == "megatron") {
    fmt::print("\nMegatron-LM arguments:\n{}", plan_export_render(plan_export_megatron(result.plan, model, train), "megatron"));
  } else if (c.emit == "deepspeed") {
    fmt::print("\nDeepSpeed configuration:\n{}", plan_export_render(plan_export_deepspeed(result.plan, model, train), "deepspeed"));
  }
  if (!c.report.empty()) {
    SimOptions simulation;
    simulation.profile = cost.profile();
    SimResult simulated = simulate(result.plan, model, cluster, simulation);
    report_save(result.plan, simulated, c.report);
    fmt::print("report written to {} (simulated step {})\n", c.report, units_format_seconds(simulated.step_seconds));
  }
}

struct ExplainCommand {
  std::string plan;
  std::string model;
  std::string cluster;
};

// A plan file's model or cluster: the one named on the command line (errors are the user's),
// else the one the plan carries (`carried`), else the preset the plan names (`named`); empty with
// `why` set when that is no preset.
template <typename Spec, typename Load>
std::optional<Spec> explain_spec(const std::string& given, bool carried, const std::string& named, const char* flag,
                                 Load load, std::string* why) {
  if (!given.empty() || carried) return load(given);
  try {
    return load(given);
  } catch (const Error&) {
    *why += fmt::format("{}the plan names '{}', which is no preset; pass {} to price it", why->empty() ? "" : "; ",
                        named, flag);
    return std::nullopt;
  }
}

// A plan with the planner's predictions is shown as saved; one without them (written by hand)
// is priced by the cost model from its choices, or shown unpriced with the reason.
void run_explain(const ExplainCommand& c) {
  Plan plan = plan_load(c.plan);
  const bool predicted = plan.step_seconds > 0;
  if (predicted && (c.model.empty() || c.cluster.empty())) {
    fmt::print("{}", plan_render_text(plan));
    return;
  }
  std::string why;
  const std::optional<ModelSpec> model =
      explain_spec<ModelSpec>(c.model, !plan.inputs.model.empty(), plan.model_name, "--model",
                              [&](const std::string& m) { return plan_model(plan, m, c.plan); }, &why);
  const std::optional<ClusterSpec> cluster =
      explain_spec<ClusterSpec>(c.cluster, !plan.inputs.cluster.empty(), plan.cluster_name, "--cluster",
                                [&](const std::string& n) { return plan_cluster(plan, n, catalog_builtin(), c.plan); }, &why);
  if (!model || !cluster) {
    RenderOptions render;
    render.unpriced_reason = "the plan file carries no predictions and " + why;
    fmt::print("{}", plan_render_text(plan, render));
    return;
  }
  // A hand-written plan may leave the fingerprints empty: it is then checked by its choices.
  if (plan.model_fingerprint.empty()) plan.model_fingerprint = model_fingerprint(*model);
  if (plan.cluster_fingerprint.empty()) plan.cluster_fingerprint = cluster_fingerprint(*cluster);
  plan_validate_for(plan, *model, *cluster, c.plan);
  if (predicted) {
    fmt::print("{}", plan_render_text(plan));
    return;
  }
  CostModel cost(*model, *cluster, plan_train(plan, "", c.plan));
  plan_evaluate(&plan, cost);
  plan.notes.push_back("priced by the cost model from the plan's choices: the plan file carries no predictions");
  for (const std::string& note : gradient_strategy_notes(plan, cost)) plan.notes.push_back(note);
  for (const std::string& note : cost.fallback_notes()) plan.notes.push_back(note);
  RenderOptions render;
  render.show_runner_ups = false;  // nothing was searched
  fmt::print("{}", plan_render_text(plan, render));
}

}  // namespace

void add_plan(CLI::App& app, int* exit_code) {
  auto c = std::make_shared<PlanCommand>();
  CLI::App* cmd = app.add_subcommand("plan", "Search the fastest hybrid-parallel layout that fits, and explain it");
  cmd->add_option("--model,-m", c->model, "Model preset or config path")->required();
  cmd->add_option("--cluster,-c", c->cluster, "Cluster preset or .yaml path")->required();
  cmd->add_option("--train,-t", c->train, "Training setup .yaml (sequence length, global batch, precision)");
  cmd->add_option("--global-batch", c->global_batch, "Sequences per step (overrides the setup)")
      ->check(option_whole_in(1, kOptionMostSequences));
  cmd->add_option("--output,-o", c->output, "Write the plan as JSON to this file");
  cmd->add_option("--report", c->report, "Also simulate the plan and write an HTML report");
  cmd->add_option("--emit", c->emit, "Also print the plan for another runtime: megatron or deepspeed")
      ->check(CLI::IsMember({"megatron", "deepspeed"}));
  search_flags_add(cmd, c->flags);
  cmd->callback([c, exit_code, cmd]() {
    search_flags_check(*cmd, c->flags);
    run_plan(*c);
    *exit_code = 0;
  });
}

void add_explain(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<ExplainCommand>();
  CLI::App* cmd = app.add_subcommand("explain", "Print the full breakdown of a saved plan");
  cmd->add_option("plan", o->plan, "plan.json written by `alloy plan -o`, or written by hand")->required();
  cmd->add_option("--model,-m", o->model, "Check (and price) the plan against this model (default: the one the plan carries)");
  cmd->add_option("--cluster,-c", o->cluster, "Check (and price) the plan against this cluster (default: the one the plan carries)");
  cmd->callback([o, exit_code]() {
    run_explain(*o);
    *exit_code = 0;
  });
}

}  // namespace alloy::cli
