// `alloy simulate` and `alloy report`: replay a saved plan event by event, print where time goes,
// and write a Chrome trace and a self-contained HTML report.
#include <fmt/core.h>

#include "cli/commands.hpp"
#include <cmath>
#include <optional>

#include "cost/profile.hpp"
#include "hw/catalog.hpp"
#include "search/planner.hpp"
#include "sim/report.hpp"
#include "sim/simulate.hpp"
#include "plan/plan_inputs.hpp"
#include "plan/trace.hpp"
#include "spec/error.hpp"
#include "spec/units.hpp"

namespace alloy::cli {

namespace {

struct SimulateCommand {
  std::string plan;
  std::string model;    // default: the plan's own (or, in a plan without inputs, its model name as a preset)
  std::string cluster;  // default: the plan's own (or its cluster name as a preset)
  std::string trace;
  std::string report;
  std::string profile;  // the measured profile the plan was made with, if any
};

void run_simulate(const SimulateCommand& c, bool print_table) {
  Plan plan = plan_load(c.plan);
  ModelSpec model = plan_model(plan, c.model, c.plan);
  ClusterSpec cluster = plan_cluster(plan, c.cluster, catalog_builtin(), c.plan);
  // Predictions in the file are not trusted: a hand-edited plan is re-priced from its choices.
  plan_validate_for(plan, model, cluster, c.plan);
  const TrainSpec train = plan_train(plan, "", c.plan);
  std::optional<Profile> profile;
  if (!c.profile.empty()) profile = profile_load(c.profile);
  CostModel cost(model, cluster, train, profile ? &*profile : nullptr);
  const double saved_step_seconds = plan.step_seconds;
  plan_evaluate(&plan, cost);
  plan_check_host_memory(plan, cluster, c.plan);
  if (saved_step_seconds > 0 && std::abs(plan.step_seconds / saved_step_seconds - 1.0) > 1e-6) {
    fmt::print("note: the plan's saved predictions differ from the cost model's for its choices "
               "(step {} saved, {} now); using the cost model's{}\n",
               units_format_seconds(saved_step_seconds), units_format_seconds(plan.step_seconds),
               profile ? "" : " (if the plan was made with --profile, pass the same profile here)");
  }
  for (const auto& note : cost.fallback_notes()) fmt::print("note: {}\n", note);
  SimOptions options;
  options.profile = cost.profile();
  SimResult result = simulate(plan, model, cluster, options);
  sim_check_memory(result, plan);
  if (print_table) fmt::print("{}", sim_render_text(result, plan));
  if (!c.trace.empty()) {
    trace_save(result, plan, c.trace);
    fmt::print("trace written to {} (open it in ui.perfetto.dev or chrome://tracing)\n", c.trace);
  }
  if (!c.report.empty()) {
    report_save(plan, result, c.report);
    fmt::print("report written to {}\n", c.report);
  }
}

void add_plan_sources(CLI::App* cmd, SimulateCommand& c) {
  cmd->add_option("--model,-m", c.model, "Model preset or path (default: the one the plan carries)");
  cmd->add_option("--cluster,-c", c.cluster, "Cluster preset or path (default: the one the plan carries)");
  cmd->add_option("--profile", c.profile, "The measured profile the plan was made with (alloy plan --profile)");
}

}  // namespace

void add_simulate(CLI::App& app, int* exit_code) {
  auto c = std::make_shared<SimulateCommand>();
  CLI::App* cmd = app.add_subcommand("simulate", "Replay a plan event by event; write its timeline");
  cmd->add_option("--plan,-p", c->plan, "plan.json written by `alloy plan -o`")->required();
  add_plan_sources(cmd, *c);
  cmd->add_option("--trace", c->trace, "Write a Chrome trace (Perfetto) of the simulated step");
  cmd->add_option("--report", c->report, "Write a self-contained HTML report");
  cmd->callback([c, exit_code]() {
    run_simulate(*c, true);
    *exit_code = 0;
  });
}

void add_report(CLI::App& app, int* exit_code) {
  auto c = std::make_shared<SimulateCommand>();
  CLI::App* cmd = app.add_subcommand("report", "Write an HTML report of a plan: table, timeline, memory, runner-ups");
  cmd->add_option("plan", c->plan, "plan.json written by `alloy plan -o`")->required();
  cmd->add_option("--output,-o", c->report, "HTML file to write")->required();
  add_plan_sources(cmd, *c);
  cmd->callback([c, exit_code]() {
    run_simulate(*c, false);
    *exit_code = 0;
  });
}

}  // namespace alloy::cli
