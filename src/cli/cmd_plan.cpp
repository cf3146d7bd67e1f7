// `alloy plan` and `alloy explain`: search the fastest layout that fits and print why it won;
// print the full breakdown of a saved plan.
#include <optional>
#include <sstream>

#include <fmt/core.h>

#include "cli/commands.hpp"
#include "cli/option_checks.hpp"
#include "cost/profile.hpp"
#include "hw/catalog.hpp"
#include "plan/export.hpp"
#include "plan/plan_inputs.hpp"
#include "search/explain.hpp"
#include "search/planner.hpp"
#include "sim/report.hpp"
#include "sim/rerank.hpp"
#include "sim/simulate.hpp"
#include "spec/error.hpp"
#include "spec/units.hpp"

namespace alloy::cli {

namespace {

// Sanity bounds of the pins, as for the specs (docs/architecture.md).
constexpr int64_t kPlanMostDevices = 1 << 20;
constexpr int64_t kPlanMostLayers = 10'000;
constexpr int64_t kPlanMostChunks = 64;

struct PlanCommand {
  std::string model;
  std::string cluster;
  std::string train;
  std::string profile;
  std::string objective = "throughput";
  std::string schedule;
  std::string recompute;
  std::string gradients;
  std::string layer_split;
  std::string device_order;
  std::string output;
  std::string report;
  std::string emit;
  int64_t global_batch = 0;
  int sequence_parallel = -1;
  bool no_offload = false;
  bool even_dp = false;
  bool no_rerank = false;
  SearchOptions search;
};

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream s(text);
  for (std::string item; std::getline(s, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::vector<int> parse_layer_split(const std::string& text) {
  std::vector<int> out;
  for (const auto& item : split_list(text)) {
    size_t used = 0;
    int value = 0;
    try {
      value = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || value <= 0) {
      throw Error("cannot read '" + item + "' as a block count", {"", "--layer-split"},
                  "give positive block counts per stage, e.g. --layer-split 10,10,12");
    }
    out.push_back(value);
  }
  return out;
}

SearchOptions search_options_from(PlanCommand& c) {
  SearchOptions o = c.search;
  o.objective = objective_from_name(c.objective);
  if (!c.schedule.empty()) {
    Schedule s;
    if (!schedule_parse(c.schedule, &s)) {
      throw Error("unknown schedule '" + c.schedule + "'", {"", "--schedule"}, "use gpipe, 1f1b or interleaved");
    }
    o.schedule = s;
  }
  if (!c.recompute.empty()) {
    Recompute r;
    if (!recompute_parse(c.recompute, &r)) {
      throw Error("unknown recomputation '" + c.recompute + "'", {"", "--recompute"}, "use none, selective or full");
    }
    o.recompute = r;
  }
  if (c.sequence_parallel >= 0) o.sequence_parallel = c.sequence_parallel == 1;
  if (!c.gradients.empty()) o.shard_gradients = c.gradients == "shard";
  o.allow_offload = !c.no_offload;
  o.allow_uneven_dp = !c.even_dp;
  o.layer_split = parse_layer_split(c.layer_split);
  o.device_order = split_list(c.device_order);
  return o;
}

void run_plan(PlanCommand& c) {
  ModelSpec model = model_load(c.model);
  ClusterSpec cluster = cluster_load(c.cluster, catalog_builtin());
  TrainSpec train;
  if (!c.train.empty()) train = train_load(c.train);
  if (c.global_batch > 0) train.global_batch_sequences = c.global_batch;
  train_validate(train);
  std::optional<Profile> profile;
  if (!c.profile.empty()) profile = profile_load(c.profile);
  CostModel cost(model, cluster, train, profile ? &*profile : nullptr);
  SearchOptions options = search_options_from(c);
  SearchResult result = plan_search(cost, options);
  if (!c.no_rerank) plan_rerank_by_simulation(&result, cost, options.objective);
  fmt::print("{}", plan_render_text(result.plan));
  const SearchStats& s = result.stats;
  fmt::print("\nsearch: {} layouts considered, {} pruned by bound, {} evaluated ({} infeasible), {} split solves in {}\n",
             s.structures, s.pruned_by_bound, s.evaluated, s.infeasible, s.split_solves,
             units_format_seconds(s.seconds));
  for (const auto& note : cost.fallback_notes()) fmt::print("note: {}\n", note);
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
  cmd->add_option("--profile", c->profile, "Measured profile JSON (docs/profile-format.md)");
  cmd->add_option("--objective", c->objective, "throughput (tokens/s) or cost (price per token)")->capture_default_str();
  cmd->add_option("--output,-o", c->output, "Write the plan as JSON to this file");
  cmd->add_option("--report", c->report, "Also simulate the plan and write an HTML report");
  cmd->add_option("--emit", c->emit, "Also print the plan for another runtime: megatron or deepspeed")
      ->check(CLI::IsMember({"megatron", "deepspeed"}));
  cmd->add_option("--tp", c->search.tp, "Pin the tensor-parallel degree of every stage")->check(option_whole_in(1, kPlanMostDevices));
  cmd->add_option("--pp", c->search.pp, "Pin the number of pipeline stages")->check(option_whole_in(1, kPlanMostDevices));
  cmd->add_option("--dp", c->search.dp, "Pin the data-parallel degree of every stage")->check(option_whole_in(1, kPlanMostDevices));
  cmd->add_option("--micro-batch", c->search.micro_batch_sequences, "Pin the micro-batch size (sequences)")
      ->check(option_whole_in(1, kOptionMostSequences));
  cmd->add_option("--num-micro-batches", c->search.num_micro_batches, "Pin the number of micro-batches")
      ->check(option_whole_in(1, kOptionMostSequences));
  cmd->add_option("--schedule", c->schedule, "Pin the schedule: gpipe, 1f1b, interleaved");
  cmd->add_option("--chunks", c->search.virtual_chunks, "Model chunks per stage for the interleaved schedule")
      ->check(option_whole_in(1, kPlanMostChunks));
  cmd->add_option("--zero", c->search.zero, "Pin the ZeRO stage (0-3)")->check(option_whole_in(0, 3));
  cmd->add_option("--gradients", c->gradients,
                  "Pin how ZeRO 2-3 stages keep gradients: shard (reduce-scatter every micro-batch, keep 1/dp) or "
                  "full (accumulate in full, reduce-scatter once per step)")
      ->check(CLI::IsMember({"shard", "full"}));
  cmd->add_option("--recompute", c->recompute, "Pin recomputation for every block: none, selective, full");
  cmd->add_option("--sequence-parallel", c->sequence_parallel, "Pin sequence parallelism: 1 or 0")
      ->check(option_whole_in(0, 1));
  cmd->add_flag("--no-offload", c->no_offload, "Never offload layers to host memory");
  cmd->add_flag("--even-dp", c->even_dp,
                "Never split micro-batches unevenly over data-parallel replicas of different device types");
  cmd->add_option("--prefetch-depth", c->search.prefetch_depth,
                  "Pin the offloaded layers fetched ahead of their use (1-8; default: 1, 2 or 4 per stage)");
  cmd->add_option("--offload-activations", c->search.offload_activations,
                  "Park the saved activations of this many layers per stage in host memory between forward and backward "
                  "(the first layers not fully recomputed; default 0)")
      ->check(option_whole_in(0, kPlanMostLayers));
  cmd->add_flag("--no-simulate", c->no_rerank,
                "Rank candidates by the analytic formula alone (default: the best few are re-ranked by simulation)");
  cmd->add_option("--layer-split", c->layer_split, "Pin blocks per stage in pipeline order, e.g. 10,10,12");
  cmd->add_option("--device-order", c->device_order, "Pin device types in pipeline order, e.g. a100-80gb-sxm,v100-32gb");
  cmd->add_flag("--all-devices", c->search.every_device,
                "Only layouts that use every device (e.g. to calibrate every device type with one run)");
  cmd->add_option("--threads", c->search.threads, "Search threads (1 or 2)")->capture_default_str()->check(option_whole_in(1, 2));
  cmd->callback([c, exit_code, cmd]() {
    option_refuse_unless(*cmd, "--chunks", c->schedule.empty() || c->schedule == "interleaved",
                         "the interleaved schedule (--schedule interleaved, or no --schedule)");
    option_refuse_unless(*cmd, "--prefetch-depth", !c->no_offload, "offloading (drop --no-offload)");
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
