// Registration and reading of the planner's flags.
#include "cli/search_flags.hpp"

#include <sstream>

#include <fmt/core.h>

#include "cli/option_checks.hpp"
#include "sim/rerank.hpp"
#include "spec/error.hpp"
#include "spec/units.hpp"

namespace alloy::cli {

namespace {

// Sanity bounds of the pins, as for the specs (docs/architecture.md).
constexpr int64_t kPlanMostDevices = 1 << 20;
constexpr int64_t kPlanMostLayers = 10'000;
constexpr int64_t kPlanMostChunks = 64;

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

}  // namespace

void search_flags_add(CLI::App* cmd, SearchFlags& c) {
  cmd->add_option("--profile", c.profile, "Measured profile JSON (docs/profile-format.md)");
  cmd->add_option("--objective", c.objective, "throughput (tokens/s) or cost (price per token)")->capture_default_str();
  cmd->add_option("--tp", c.search.tp, "Pin the tensor-parallel degree of every stage")->check(option_whole_in(1, kPlanMostDevices));
  cmd->add_option("--pp", c.search.pp, "Pin the number of pipeline stages")->check(option_whole_in(1, kPlanMostDevices));
  cmd->add_option("--dp", c.search.dp, "Pin the data-parallel degree of every stage")->check(option_whole_in(1, kPlanMostDevices));
  cmd->add_option("--ep", c.search.ep, "Pin the expert-parallel degree of every stage (Mixture-of-Experts models)")
      ->check(option_whole_in(1, kPlanMostDevices));
  cmd->add_option("--micro-batch", c.search.micro_batch_sequences, "Pin the micro-batch size (sequences)")
      ->check(option_whole_in(1, kOptionMostSequences));
  cmd->add_option("--num-micro-batches", c.search.num_micro_batches, "Pin the number of micro-batches")
      ->check(option_whole_in(1, kOptionMostSequences));
  cmd->add_option("--schedule", c.schedule, "Pin the schedule: gpipe, 1f1b, interleaved");
  cmd->add_option("--chunks", c.search.virtual_chunks, "Model chunks per stage for the interleaved schedule")
      ->check(option_whole_in(1, kPlanMostChunks));
  cmd->add_option("--zero", c.search.zero, "Pin the ZeRO stage (0-3)")->check(option_whole_in(0, 3));
  cmd->add_option("--gradients", c.gradients,
                  "Pin how ZeRO 2-3 stages keep gradients: shard (reduce-scatter every micro-batch, keep 1/dp) or "
                  "full (accumulate in full, reduce-scatter once per step)")
      ->check(CLI::IsMember({"shard", "full"}));
  cmd->add_option("--recompute", c.recompute, "Pin recomputation for every block: none, selective, full");
  cmd->add_option("--sequence-parallel", c.sequence_parallel, "Pin sequence parallelism: 1 or 0")
      ->check(option_whole_in(0, 1));
  cmd->add_flag("--no-offload", c.no_offload, "Never offload layers to host memory");
  cmd->add_flag("--even-dp", c.even_dp,
                "Never split micro-batches unevenly over data-parallel replicas of different device types");
  cmd->add_option("--prefetch-depth", c.search.prefetch_depth,
                  "Pin the offloaded layers fetched ahead of their use (1-8; default: 1, 2 or 4 per stage)");
  cmd->add_option("--offload-activations", c.search.offload_activations,
                  "Park the saved activations of this many layers per stage in host memory between forward and backward "
                  "(the first layers not fully recomputed; default 0)")
      ->check(option_whole_in(0, kPlanMostLayers));
  cmd->add_flag("--no-simulate", c.no_rerank,
                "Rank candidates by the analytic formula alone (default: the best few are re-ranked by simulation)");
  cmd->add_option("--layer-split", c.layer_split, "Pin blocks per stage in pipeline order, e.g. 10,10,12");
  cmd->add_option("--device-order", c.device_order, "Pin device types in pipeline order, e.g. a100-80gb-sxm,v100-32gb");
  cmd->add_flag("--all-devices", c.search.every_device,
                "Only layouts that use every device (e.g. to calibrate every device type with one run)");
  cmd->add_option("--threads", c.search.threads, "Search threads (1 or 2)")->capture_default_str()->check(option_whole_in(1, 2));
}

void search_flags_check(const CLI::App& cmd, const SearchFlags& c) {
  option_refuse_unless(cmd, "--chunks", c.schedule.empty() || c.schedule == "interleaved",
                       "the interleaved schedule (--schedule interleaved, or no --schedule)");
  option_refuse_unless(cmd, "--prefetch-depth", !c.no_offload, "offloading (drop --no-offload)");
}

SearchOptions search_options_from(const SearchFlags& c) {
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

std::optional<Profile> search_flags_profile(const SearchFlags& flags) {
  if (flags.profile.empty()) return std::nullopt;
  return profile_load(flags.profile);
}

SearchResult search_flags_run(const CostModel& cost, const SearchFlags& flags) {
  const SearchOptions options = search_options_from(flags);
  SearchResult result = plan_search(cost, options);
  if (!flags.no_rerank) plan_rerank_by_simulation(&result, cost, options.objective);
  fmt::print("{}", plan_render_text(result.plan));
  const SearchStats& s = result.stats;
  fmt::print("\nsearch: {} layouts considered, {} pruned by bound, {} evaluated ({} infeasible), {} split solves in {}\n",
             s.structures, s.pruned_by_bound, s.evaluated, s.infeasible, s.split_solves,
             units_format_seconds(s.seconds));
  for (const auto& note : cost.fallback_notes()) fmt::print("note: {}\n", note);
  return result;
}

}  // namespace alloy::cli
