// The planner's main loop: enumerate structures best-bound first, solve each one's layer split
// and per-stage choices exactly (dynamic programming on the bottleneck), keep the best and the
// runner-ups, explain them.
#include "search/planner.hpp"

#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "plan/runnable.hpp"
#include "search/expert_placement.hpp"
#include "search/explain.hpp"
#include "search/layouts.hpp"
#include "search/network_notes.hpp"
#include "search/search_checks.hpp"
#include "search/structure_solver.hpp"
#include "search/uneven_dp.hpp"
#include "spec/error.hpp"
#include "spec/units.hpp"

namespace alloy {

namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();
// The widest tp a refusal lists among those a model runs with.
constexpr int kMaxTensorParallelism = 64;

}  // namespace

SearchResult plan_search(const CostModel& cost, const SearchOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  search_options_validate(cost, options);
  const ClusterSpec& cluster = cost.cluster();
  const std::vector<TypePool> pools = type_pools(cluster);
  StructureBounds structure_bounds(cost, options, pools);
  std::vector<Structure> structures = structures_enumerate(cost, pools, options, structure_bounds);
  // One stage over devices of several types (e.g. a pinned dp that spans them) is no structure.
  std::optional<Plan> uneven = uneven_dp_best(cost, options);
  if (structures.empty() && !uneven)
    throw Error("no layout matches the pinned choices on this cluster", {"", ""},
                fmt::format("check that tp divides the devices per node and is one model {} runs with ({}), that "
                            "tp x dp x pp uses each device type fully, and that the batch divides into the pinned "
                            "micro-batches and dp{}",
                            cost.model().name, tp_runnable_list(cost.model(), kMaxTensorParallelism),
                            options.schedule == Schedule::Schedule_interleaved
                                ? "; interleaved, every stage needs a layer per chunk (pp x chunks <= layers) and the "
                                  "micro-batches a multiple of pp"
                                : ""));
  const bool by_cost = options.objective == Objective::Objective_cost;
  const double tokens = static_cast<double>(cost.train().seq_len);
  auto score_factor = [&](const Structure& s) {
    return by_cost ? s.price_per_second / (static_cast<double>(s.global_batch) * tokens) * 1e6
                   : 1.0 / (static_cast<double>(s.global_batch) * tokens);  // seconds per token
  };
  std::vector<double> bound(structures.size());
  std::vector<int> heap(structures.size());
  for (size_t i = 0; i < heap.size(); ++i) {
    heap[i] = static_cast<int>(i);
    bound[i] = structures[i].lower_bound_seconds * score_factor(structures[i]);
  }
  // Best bound first; usually a small prefix is visited, so pop from a heap instead of sorting.
  const auto later = [&](int x, int y) {
    if (bound[x] != bound[y]) return bound[x] > bound[y];
    return x > y;
  };
  std::make_heap(heap.begin(), heap.end(), later);
  auto next_structure = [&]() {
    std::pop_heap(heap.begin(), heap.end(), later);
    const int next = heap.back();
    heap.pop_back();
    return next;
  };
  // A family reached by the search becomes its pipeline orders, each with its own bound.
  auto expand = [&](int family) {
    for (Structure& s : structure_orders(structures[family], structure_bounds)) {
      s.index = static_cast<int>(structures.size());
      bound.push_back(s.lower_bound_seconds * score_factor(s));
      structures.push_back(std::move(s));
      heap.push_back(structures.back().index);
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };

  // Structures are visited in rounds of a few, best bound first; within a round every
  // structure sees the threshold the round started with, so one or two threads (each with its
  // own caches) reach the same plan.
  std::vector<std::unique_ptr<StructureSolver>> searchers;
  for (int t = 0; t < options.threads; ++t) searchers.push_back(std::make_unique<StructureSolver>(cost, options));
  SearchStats& stats = searchers.front()->stats;
  for (const Structure& s : structures) stats.structures += s.orders;
  const size_t keep = static_cast<size_t>(std::max(0, options.runner_ups)) + 1;
  std::vector<std::pair<std::string, Solution>> kept;  // distinct layouts, best score first
  double frugal_ratio = kInfinity;
  double frugal_bytes = 0;
  int frugal_type = 0;
  HostShortfall host_shortfall;
  struct Outcome {
    bool refined_pruned = false;
    std::optional<Solution> solution;
    double frugal_ratio = kInfinity;
    double frugal_bytes = 0;
    int frugal_type = 0;
    HostShortfall host;
  };
  auto evaluate = [&](StructureSolver& searcher, const Structure& s, double threshold) {
    Outcome out;
    const double factor = score_factor(s);
    std::vector<SlotInfo> slots = searcher.slots(s, pools);
    double bottleneck_bound = 0;
    const double refined = searcher.refined_lower_bound(s, slots, &bottleneck_bound);
    if (refined * factor >= threshold) {
      out.refined_pruned = true;
      return out;
    }
    bool limited = false;
    out.solution = searcher.solve(s, slots, threshold / factor, refined, bottleneck_bound, &limited);
    if (out.solution) out.solution->score = out.solution->step_seconds * factor;
    else if (limited) out.refined_pruned = true;
    else out.frugal_ratio = searcher.frugal_memory_ratio(s, slots, &out.frugal_bytes, &out.frugal_type, &out.host);
    return out;
  };
  constexpr size_t kRound = 8;
  while (!heap.empty()) {
    const double threshold = kept.size() < keep ? kInfinity : kept.back().second.score;
    std::vector<int> round;
    while (!heap.empty() && round.size() < kRound) {
      const int next = next_structure();
      if (bound[next] >= threshold) {
        stats.pruned_by_bound += structures[next].orders;
        for (int left : heap) stats.pruned_by_bound += structures[left].orders;
        heap.clear();
        break;
      }
      if (structures[next].all_orders) expand(next);
      else round.push_back(next);
    }
    std::vector<Outcome> outcomes(round.size());
    auto work = [&](int thread) {
      for (size_t i = thread; i < round.size(); i += searchers.size())
        outcomes[i] = evaluate(*searchers[thread], structures[round[i]], threshold);
    };
    if (searchers.size() > 1 && round.size() > 1) {
      std::thread helper(work, 1);
      work(0);
      helper.join();
    } else {
      work(0);
    }
    for (size_t i = 0; i < round.size(); ++i) {
      Outcome& out = outcomes[i];
      if (out.refined_pruned) {
        ++stats.pruned_by_refined_bound;
        continue;
      }
      ++stats.evaluated;
      if (!out.solution) {
        ++stats.infeasible;
        if (out.frugal_ratio < frugal_ratio) {
          frugal_ratio = out.frugal_ratio;
          frugal_bytes = out.frugal_bytes;
          frugal_type = out.frugal_type;
        }
        if (out.host.ratio < host_shortfall.ratio) host_shortfall = out.host;
        continue;
      }
      const Solution& solution = *out.solution;
      const std::string key = structure_layout_key(structures[round[i]], cluster);
      auto same = std::find_if(kept.begin(), kept.end(), [&](const auto& e) { return e.first == key; });
      if (same != kept.end()) {
        if (same->second.score <= solution.score) continue;
        kept.erase(same);
      }
      auto at = std::find_if(kept.begin(), kept.end(), [&](const auto& e) { return solution.score < e.second.score; });
      kept.insert(at, {key, solution});
      if (kept.size() > keep) kept.pop_back();
    }
  }
  for (size_t t = 1; t < searchers.size(); ++t) {
    stats.split_solves += searchers[t]->stats.split_solves;
    stats.stage_option_sets += searchers[t]->stats.stage_option_sets;
  }

  if (kept.empty() && !uneven && host_shortfall.ratio < kInfinity) search_host_memory_fail(cluster, host_shortfall);
  if (kept.empty() && !uneven) {
    const DeviceType& type = cluster.device_types[frugal_type];
    std::string hint = "add devices";
    if (options.recompute && *options.recompute != Recompute::Recompute_full) hint += ", allow full recomputation";
    if (!options.allow_offload) hint += ", allow offload to host memory";
    if (options.zero >= 0 && options.zero < 3) hint += ", allow ZeRO-3";
    if (options.shard_gradients && *options.shard_gradients && options.allow_offload)
      hint += ", drop --gradients shard (layers are offloaded only with gradients accumulated in full)";
    if (options.micro_batch_sequences > 1 || options.num_micro_batches > 0) hint += ", use a smaller micro-batch";
    if (options.tp > 0 || options.pp > 0 || options.dp > 0) hint += ", unpin tp/pp/dp";
    if (options.ep > 1) hint += fmt::format(", leave --ep {} out (a stage whose dp it does not divide has no layout)", options.ep);
    if (options.every_device) hint += ", drop --all-devices (a device too small for any share can then sit out)";
    throw Error(fmt::format("nothing fits in device memory: the most frugal layout needs {} per {} device, "
                            "which has {}",
                            units_format_bytes(frugal_bytes), type.name, units_format_bytes(type.memory_bytes)),
                {cluster.source_path, ""}, hint + ", or train a smaller model or shorter sequences");
  }

  std::vector<Plan> plans;
  for (const auto& [key, sol] : kept) {
    const Structure& s = structures[sol.structure];
    std::vector<std::vector<int>> device_ids;
    for (const SlotInfo& info : searchers.front()->slots(s, pools)) device_ids.emplace_back(info.device_ids.begin(), info.device_ids.end());
    plans.push_back(plan_build(cost, s, device_ids, sol.blocks, sol.options, options.objective));
    expert_placement_refine(cost, &plans.back());
  }
  const auto score = [&](const Plan& p) { return by_cost ? p.price_per_million_tokens : 1.0 / p.tokens_per_second; };
  // A placement by measured routing load may have moved a plan ahead of another.
  std::stable_sort(plans.begin(), plans.end(), [&](const Plan& a, const Plan& b) { return score(a) < score(b); });
  if (uneven) {
    auto at = std::find_if(plans.begin(), plans.end(), [&](const Plan& p) { return score(*uneven) < score(p); });
    plans.insert(at, std::move(*uneven));
    if (plans.size() > keep) plans.pop_back();
    ++stats.evaluated;
  }
  // Every candidate carries its own notes: simulation may re-rank them.
  for (Plan& plan : plans) {
    for (const std::string& note : zero_pin_notes(plan, options)) plan.notes.push_back(note);
    for (const std::string& note : gradient_strategy_notes(plan, cost)) plan.notes.push_back(note);
    for (const std::string& note : cost.fallback_notes()) plan.notes.push_back(note);
    for (const std::string& note : published_mfu_notes(plan, cost)) plan.notes.push_back(note);
    for (const std::string& note : network_notes(plan, cost.cluster())) plan.notes.push_back(note);
    for (const std::string& note : expert_placement_notes(cost, plan)) plan.notes.push_back(note);
  }
  SearchResult result;
  result.candidates = plans;
  result.plan = std::move(plans.front());
  for (size_t i = 1; i < plans.size(); ++i)
    result.plan.runner_ups.push_back(runner_up_explain(result.plan, plans[i], by_cost));
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  result.stats = stats;
  return result;
}

}  // namespace alloy
