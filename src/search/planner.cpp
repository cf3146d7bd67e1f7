// The planner's main loop: enumerate structures best-bound first, solve each one's layer split
// and per-stage choices exactly (dynamic programming on the bottleneck), keep the best and the
// runner-ups, explain them.
#include "search/planner.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "cost/network_paths.hpp"
#include "plan/runnable.hpp"
#include "cost/moe_cost.hpp"
#include "search/expert_options.hpp"
#include "search/expert_placement.hpp"
#include "search/explain.hpp"
#include "search/layouts.hpp"
#include "search/network_notes.hpp"
#include "search/option_cache.hpp"
#include "search/search_checks.hpp"
#include "search/split_bound.hpp"
#include "search/stage_options.hpp"
#include "search/uneven_dp.hpp"
#include "spec/error.hpp"
#include "spec/units.hpp"

namespace alloy {

namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();
// The widest tp a refusal lists among those a model runs with.
constexpr int kMaxTensorParallelism = 64;

// A stage with its key parts, inside one structure.
struct SlotInfo {
  StageSlot slot;
  UnitKey unit_key;  // sp = 0
  std::span<const int> device_ids;  // into the type's pool
  int64_t placement = 0;            // first device, tp and dp: identifies the stage's placement
  std::vector<SlotAtEp> at_ep;  // MoE models: the slot at each ep it may take (empty for dense models)
};

struct Solution {
  int structure = -1;
  double step_seconds = kInfinity;
  double score = kInfinity;
  std::vector<int> blocks;  // per stage
  std::vector<StageOption> options;
};

class Searcher {
 public:
  Searcher(const CostModel& cost, const SearchOptions& options) : cost_(cost), options_(options) {
    pins_.zero = options.zero;
    pins_.shard_gradients = options.shard_gradients ? (*options.shard_gradients ? 1 : 0) : -1;
    pins_.sequence_parallel = options.sequence_parallel ? (*options.sequence_parallel ? 1 : 0) : -1;
    pins_.recompute = options.recompute ? static_cast<int>(*options.recompute) : -1;
    // Offload of Mixture-of-Experts blocks does not run yet (src/runtime/stage_backend.cpp).
    pins_.allow_offload = options.allow_offload && !model_is_moe(cost.model());
    pins_.prefetch_depth = options.prefetch_depth;
    pins_.offload_activations = options.offload_activations;
  }

  const StageUnitCosts* unit(const StageShape& shape, UnitKey key) {
    auto it = units_.find(key);
    if (it == units_.end()) it = units_.emplace(key, cost_.unit_costs(shape, key.sp == 1)).first;
    return &it->second;
  }

  SlotOptionSets& option_sets(const SlotInfo& info) {
    SlotKey key{info.unit_key, info.slot.in_flight, info.slot.boundary_seconds, info.slot.chunks_sent,
                (info.slot.has_embedding ? 1 : 0) | (info.slot.has_head ? 2 : 0) |
                    (info.slot.head_holds_lm_matrix ? 4 : 0) | (info.slot.has_next ? 8 : 0),
                info.slot.micro_batches, info.slot.leading_dense_blocks, info.slot.virtual_chunks};
    auto it = option_sets_.find(key);
    if (it == option_sets_.end())
      it = option_sets_.emplace(key, SlotOptionSets(static_cast<int>(cost_.model().num_layers))).first;
    return it->second;
  }

  const std::vector<StageOption>& options(const SlotInfo& info, SlotOptionSets& sets, int blocks) {
    std::vector<StageOption>& set = sets.sets[blocks];
    if (!sets.computed[blocks]) {
      ++stats.stage_option_sets;
      if (model_is_moe(cost_.model())) stage_options_over_ep(cost_, info.slot, info.at_ep, blocks, pins_, &set);
      else stage_options(cost_, info.slot, blocks, pins_, &set);
      sets.computed[blocks] = 1;
    }
    return set;
  }

  // The slot at each expert-parallel degree its dp allows (ep 1 is the slot itself).
  void add_expert_degrees(SlotInfo* info, int dp, bool plain_allowed, bool sp_allowed) {
    const int experts = static_cast<int>(cost_.model().moe.num_experts);
    for (int ep : stage_ep_degrees(dp, experts, options_.ep)) {
      SlotAtEp a;
      a.ep = ep;
      a.shape = info->slot.shape;
      // Priced as the even split prices it (plan evaluation does so while the placement is
      // even), so a chosen plan fits before expert_placement_refine places experts by load.
      moe_shape_set(cost_, &a.shape, ids_of(*info), ep, static_cast<double>(experts) / ep, 0, 0,
                    moe_even_split_skew(cost_.expert_token_shares(), ep));
      UnitKey k = info->unit_key;
      k.ep = ep;
      if (plain_allowed) a.unit[0] = unit(a.shape, k);
      k.sp = 1;
      if (sp_allowed) a.unit[1] = unit(a.shape, k);
      info->at_ep.push_back(std::move(a));
    }
  }

  static std::vector<int> ids_of(const SlotInfo& info) { return {info.device_ids.begin(), info.device_ids.end()}; }

  // The path between two adjacent stages, by their placements.
  const BoundaryLink& boundary(const SlotInfo& from, const SlotInfo& to) {
    const std::pair<int64_t, int64_t> key{from.placement, to.placement};
    auto it = boundaries_.find(key);
    if (it == boundaries_.end()) it = boundaries_.emplace(key, cost_.boundary_link(ids_of(from), ids_of(to))).first;
    return it->second;
  }

  // Summing a table tied between the first and last stage, by their placements (0 when untied).
  double tied_table(const SlotInfo& first, const SlotInfo& last) {
    const std::pair<int64_t, int64_t> key{first.placement, last.placement};
    auto it = tied_tables_.find(key);
    if (it == tied_tables_.end())
      it = tied_tables_
               .emplace(key, network_tied_table_seconds(cost_.cluster(), cost_.model(),
                                                        static_cast<int>(cost_.gradient_wire_bytes(0)), ids_of(first),
                                                        first.slot.shape.tp, ids_of(last), last.slot.shape.tp))
               .first;
    return it->second;
  }

  std::vector<SlotInfo> slots(const Structure& s, const std::vector<TypePool>& pools) {
    const int p = s.num_stages();
    const int64_t micro = s.micro_batch_sequences();
    std::vector<SlotInfo> out;
    for (const TypeGroup& g : *s.groups) {
      const TypePool* pool = nullptr;
      for (const TypePool& tp : pools)
        if (tp.device_type == g.device_type) pool = &tp;
      const int size = g.tp * g.dp;
      for (int j = 0; j < g.stages; ++j) {
        SlotInfo info;
        info.device_ids = std::span<const int>(pool->device_ids).subspan(static_cast<size_t>(j) * size, size);
        StageSlot& slot = info.slot;
        // Stages start at multiples of their size in the type's devices: first id, tp, dp
        // identify the placement.
        info.placement = (static_cast<int64_t>(info.device_ids.front()) * 4096 + g.tp) * 65536 + g.dp;
        auto cached = shapes_.find(info.placement);
        if (cached == shapes_.end())
          cached = shapes_.emplace(info.placement, cost_.stage_shape(ids_of(info), g.tp, g.dp, 1)).first;
        slot.shape = cached->second;
        slot.shape.micro_batch = micro / g.dp;
        info.unit_key = {g.device_type, g.tp, g.dp, slot.shape.dp_group.nodes, slot.shape.dp_group.concurrent_per_node,
                         0, micro / g.dp, 1};
        const bool sp_allowed = g.tp > 1 && pins_.sequence_parallel != 0 &&
                                group_sequence_parallel_runnable(g, micro, cost_.train().seq_len);
        const bool plain_allowed = pins_.sequence_parallel != 1 || g.tp == 1;
        UnitKey k = info.unit_key;
        if (plain_allowed) slot.unit[0] = unit(slot.shape, k);
        k.sp = 1;
        if (sp_allowed) slot.unit[1] = unit(slot.shape, k);
        if (model_is_moe(cost_.model())) add_expert_degrees(&info, g.dp, plain_allowed, sp_allowed);
        slot.capacity_bytes = cost_.device_memory_bytes(g.device_type);
        slot.host_capacity_bytes = cost_.host_memory_share_bytes(g.device_type);
        out.push_back(std::move(info));
      }
    }
    for (int i = 0; i < p; ++i) {
      StageSlot& slot = out[i].slot;
      slot.in_flight = schedule_micro_batches_in_flight(s.schedule, p, i, s.micro_batches, s.virtual_chunks);
      slot.micro_batches = s.micro_batches;
      slot.has_next = p > 1;
      slot.has_embedding = i == 0;
      slot.has_head = i == p - 1;
      // A later stage holds leading dense blocks only when the first takes fewer: priced as MoE
      // blocks here, exactly once the plan is evaluated.
      slot.leading_dense_blocks =
          i == 0 && model_is_moe(cost_.model()) ? static_cast<int>(cost_.model().moe.first_dense_layers) : 0;
      slot.virtual_chunks = s.virtual_chunks;
      slot.head_holds_lm_matrix = !(cost_.model().tied_embeddings && p == 1);
      const int next = (i + 1) % p;
      if (next != i && (i + 1 < p || s.virtual_chunks > 1)) {
        const StageUnitCosts* u = slot.unit[0] ? slot.unit[0] : slot.unit[1];
        slot.boundary_seconds = boundary_seconds(u->boundary_bytes, boundary(out[i], out[next]));
        slot.chunks_sent = i + 1 < p ? s.virtual_chunks : s.virtual_chunks - 1;
      }
      if (p > 1) slot.chunks_received = i > 0 ? s.virtual_chunks : s.virtual_chunks - 1;
    }
    if (p > 1) out[0].slot.tied_table_seconds = out[p - 1].slot.tied_table_seconds = tied_table(out[0], out[p - 1]);
    return out;
  }

  // Minimum total per-micro-batch time over layer splits whose every stage keeps
  // (m - 1/v) t + u <= cap. Fills blocks and options; false when nothing fits.
  // `k_limit`: per stage, the most units it may take (more would make the step no faster than
  // the threshold).
  bool split_min_sum(const Structure& s, std::vector<SlotInfo>& slot_infos, double cap, const std::vector<int>& k_limit,
                     std::vector<int>* blocks, std::vector<StageOption>* chosen, double* sum) {
    ++stats.split_solves;
    const int p = static_cast<int>(slot_infos.size());
    const int v = s.virtual_chunks;
    const int units = static_cast<int>(cost_.model().num_layers) / v;
    const double a = s.micro_batches - 1.0 / v;
    const size_t width = static_cast<size_t>(units) + 1;
    std::vector<double>& best = scratch_.best;
    best.assign((p + 1) * width, kInfinity);
    std::vector<int>& take = scratch_.take;
    take.assign((p + 1) * width, 0);
    std::vector<const StageOption*>& pick = scratch_.pick;
    pick.assign((p + 1) * width, nullptr);
    if (option_table_.size() != static_cast<size_t>(p) * width) option_table_.assign(static_cast<size_t>(p) * width, nullptr);
    best[0] = 0;
    // Per stage, the fastest option under the cap for each layer count. A stage with more
    // blocks is dominated option by option by one with fewer (less memory, time and
    // overhead), so the first count without an option under the cap ends the list.
    std::vector<const StageOption*>& under_cap = scratch_.under_cap;
    under_cap.assign(static_cast<size_t>(p) * width, nullptr);
    std::vector<int> k_max(p + 1, 0);
    for (int st = 0; st < p; ++st) {
      const int k_first = options_.layer_split.empty() ? 1 : options_.layer_split[st] / v;
      const int k_last = std::min(k_limit[st], options_.layer_split.empty() ? units - (p - 1) : options_.layer_split[st] / v);
      SlotOptionSets* sets = nullptr;
      for (int k = k_first; k <= k_last; ++k) {
        const std::vector<StageOption>*& cached = option_table_[st * width + k];
        if (!cached) {
          if (!sets) sets = &option_sets(slot_infos[st]);
          cached = &options(slot_infos[st], *sets, k * v);
        }
        const StageOption* found = nullptr;
        for (const StageOption& o : *cached)
          if (a * o.t + o.u + slot_infos[st].slot.tied_table_seconds <= cap) {
            found = &o;
            break;
          }
        if (!found) break;
        under_cap[st * width + k] = found;
        k_max[st] = k;
      }
      if (k_max[st] == 0) return false;
    }
    // Most units the stages from st on can take, for pruning splits that cannot finish.
    std::vector<int> suffix(p + 1, 0);
    for (int st = p - 1; st >= 0; --st) suffix[st] = suffix[st + 1] + k_max[st];
    for (int st = 0; st < p; ++st) {
      const int remaining_after = p - st - 1;
      for (int j = 0; j + remaining_after < units; ++j) {
        const double base = best[st * width + j];
        if (base == kInfinity) continue;
        const int k_lo = std::max(1, units - j - suffix[st + 1]);
        const int k_hi = std::min(k_max[st], units - j - remaining_after);
        for (int k = k_lo; k <= k_hi; ++k) {
          const StageOption* found = under_cap[st * width + k];
          if (!found) continue;  // below a pinned split
          const size_t cell = (st + 1) * width + j + k;
          const double total = base + found->t;
          if (total < best[cell]) {
            best[cell] = total;
            take[cell] = k;
            pick[cell] = found;
          }
        }
      }
    }
    if (best[p * width + units] == kInfinity) return false;
    blocks->assign(p, 0);
    chosen->assign(p, StageOption{});
    int j = units;
    for (int st = p; st > 0; --st) {
      const size_t cell = st * width + j;
      (*blocks)[st - 1] = take[cell] * v;
      (*chosen)[st - 1] = *pick[cell];
      j -= take[cell];
    }
    *sum = best[p * width + units];
    return true;
  }

  // Exact best split for a structure: walk the bottleneck cap down from infinity, each time
  // solving the min-sum split under the cap; stop when no smaller cap can win.
  // `bound` and `slowest_stage_bound`: refined_lower_bound's answers for this structure, the
  // last structure it was given. `*limited`: no split was found below the threshold, though
  // some might fit.
  std::optional<Solution> solve(const Structure& s, std::vector<SlotInfo>& slot_infos, double threshold_seconds,
                                double bound, double slowest_stage_bound, bool* limited) {
    option_table_.clear();
    const int v = s.virtual_chunks;
    const double a = s.micro_batches - 1.0 / v;
    double bottleneck_bound = a * slowest_stage_bound;
    // A split whose stage st takes k units has a step of at least the bound's sum part plus
    // a (fixed + k unit) for that stage: counts past the threshold are never priced.
    const int p = static_cast<int>(slot_infos.size());
    const int units = static_cast<int>(cost_.model().num_layers) / v;
    std::vector<int>& k_limit = scratch_.k_limit;
    k_limit.assign(p, units);
    *limited = false;
    if (threshold_seconds < kInfinity) {
      const double room = (threshold_seconds - (bound - bottleneck_bound)) / a;
      for (int st = 0; st < p; ++st) {
        const StageRate& r = scratch_.stage_rates[st];
        const double most = std::floor((room - r.fixed_seconds) / r.unit_seconds * (1 + 1e-9));
        if (most < units) {
          k_limit[st] = static_cast<int>(std::max(0.0, most));
          *limited = true;
        }
      }
    }
    std::optional<Solution> best;
    double cap = kInfinity;
    std::vector<int> blocks;
    std::vector<StageOption> chosen;
    bool exact_bottleneck = false;
    while (true) {
      double sum = 0;
      if (!split_min_sum(s, slot_infos, cap, k_limit, &blocks, &chosen, &sum)) break;
      double bottleneck = 0;
      for (size_t st = 0; st < chosen.size(); ++st)
        bottleneck = std::max(bottleneck, a * chosen[st].t + chosen[st].u + slot_infos[st].slot.tied_table_seconds);
      const double step = sum / v + bottleneck;
      if (!best || step < best->step_seconds) {
        best = Solution{s.index, step, step, blocks, chosen};
      }
      const double target = std::min(best->step_seconds, threshold_seconds);
      if (sum / v + bottleneck_bound >= target) break;
      // The first solve filled every (stage, count) option set: the exact smallest bottleneck
      // over all splits bounds every later one. Priced only when the cheap bound falls short.
      if (!exact_bottleneck) {
        bottleneck_bound = std::max(bottleneck_bound, min_bottleneck(s, slot_infos));
        exact_bottleneck = true;
        if (sum / v + bottleneck_bound >= target) break;
      }
      cap = std::nextafter(bottleneck, 0.0);
    }
    return best;
  }

  // Smallest possible max over stages of (m - 1/v) t + u, over every split, from the option
  // sets the last split_min_sum visited (min-max dynamic program).
  double min_bottleneck(const Structure& s, const std::vector<SlotInfo>& slot_infos) {
    const int p = static_cast<int>(slot_infos.size());
    const int v = s.virtual_chunks;
    const int units = static_cast<int>(cost_.model().num_layers) / v;
    const double a = s.micro_batches - 1.0 / v;
    const size_t width = static_cast<size_t>(units) + 1;
    // Per (stage, count): the stage's smallest (m - 1/v) t + u; NaN where the structure does not
    // allow the count (pinned split). Counts end at the first without an option (more blocks
    // need more memory).
    std::vector<double>& fastest = scratch_.fastest;
    fastest.assign(p * width, kInfinity);
    std::vector<int>& k_end = scratch_.k_end;
    k_end.assign(p, units + 1);
    for (int st = 0; st < p; ++st)
      for (int k = 1; k <= units; ++k) {
        const std::vector<StageOption>* set = option_table_[st * width + k];
        if (!set) {
          fastest[st * width + k] = std::numeric_limits<double>::quiet_NaN();
          continue;
        }
        if (set->empty()) {
          k_end[st] = k;
          break;
        }
        for (const StageOption& o : *set)
          fastest[st * width + k] =
              std::min(fastest[st * width + k], a * o.t + o.u + slot_infos[st].slot.tied_table_seconds);
      }
    std::vector<double>& worst = scratch_.worst;
    worst.assign((p + 1) * width, kInfinity);
    worst[0] = 0;
    for (int st = 0; st < p; ++st)
      for (int j = 0; j < units; ++j) {
        const double before = worst[st * width + j];
        if (before == kInfinity) continue;
        const int k_last = std::min(units - j, k_end[st] - 1);
        for (int k = 1; k <= k_last; ++k) {
          const double g = fastest[st * width + k];
          if (std::isnan(g)) continue;
          double& cell = worst[(st + 1) * width + j + k];
          cell = std::min(cell, std::max(before, g));
        }
      }
    return worst[p * width + units];
  }

  // A lower bound on the step time from the actual stages: each stage's time is at least its
  // blocks' time plus its fixed part (boundary sends, embedding, head). Returns the bound and
  // sets the matching bound on the slowest stage (per micro-batch).
  double refined_lower_bound(const Structure& s, const std::vector<SlotInfo>& slot_infos, double* bottleneck) {
    const int v = s.virtual_chunks;
    const int layers = static_cast<int>(cost_.model().num_layers);
    const int units = layers / v;
    const int p = static_cast<int>(slot_infos.size());
    std::vector<StageRate>& stages = scratch_.stage_rates;
    stages.assign(p, StageRate{1, kInfinity, kInfinity});
    double fixed_sum = 0;
    double fastest = kInfinity;
    for (int i = 0; i < p; ++i) {
      const StageSlot& slot = slot_infos[i].slot;
      double per_block = kInfinity;
      for (const StageUnitCosts* u : slot.unit) {
        if (!u) continue;
        per_block = std::min(per_block, u->block.forward_seconds + u->block.backward_seconds);
        double f = 2.0 * slot.chunks_sent * slot.boundary_seconds;
        if (slot.has_embedding) f += u->embedding.forward_seconds + u->embedding.backward_seconds;
        if (slot.has_head) f += u->head.forward_seconds + u->head.backward_seconds;
        stages[i].fixed_seconds = std::min(stages[i].fixed_seconds, f);
      }
      stages[i].unit_seconds = v * per_block;
      fixed_sum += stages[i].fixed_seconds + v * per_block;
      fastest = std::min(fastest, per_block);
    }
    const double lo = split_bottleneck_bound(stages, units);
    *bottleneck = lo;
    const double sum = fixed_sum + (layers - p * v) * fastest;
    return sum / v + (s.micro_batches - 1.0 / v) * lo;
  }

  // Memory the most frugal even split of a structure needs, as a multiple of capacity; and,
  // when every stage would fit device memory by offloading more than host memory holds, the
  // host memory per device the most demanding stage needs, as a multiple of its share.
  double frugal_memory_ratio(const Structure& s, std::vector<SlotInfo>& slot_infos, double* bytes, int* type,
                             HostShortfall* host) {
    const int p = static_cast<int>(slot_infos.size());
    const int v = s.virtual_chunks;
    const int units = static_cast<int>(cost_.model().num_layers) / v;
    double worst = 0;
    HostShortfall need{0, 0, 0};
    for (int st = 0; st < p; ++st) {
      const StageSlot& slot = slot_infos[st].slot;
      const int k = (units / p + (st < units % p ? 1 : 0)) * v;
      const double bytes_needed = stage_min_memory_bytes(cost_, slot, k, pins_);
      const double ratio = bytes_needed / slot.capacity_bytes;
      if (ratio > worst) {
        worst = ratio;
        *bytes = bytes_needed;
        *type = slot.shape.device_type;
      }
      const double host_bytes = stage_min_host_bytes(cost_, slot, k, pins_);
      const double host_ratio = host_bytes / slot.host_capacity_bytes;
      if (host_ratio > need.ratio) need = {host_ratio, host_bytes, slot.shape.device_type};
    }
    if (worst > 1 && need.ratio > 1 && need.ratio < kInfinity && need.ratio < host->ratio) *host = need;
    return worst;
  }

  SearchStats stats;

 private:
  const CostModel& cost_;
  const SearchOptions& options_;
  OptionPins pins_;
  std::unordered_map<UnitKey, StageUnitCosts, KeyHash> units_;
  std::unordered_map<int64_t, StageShape> shapes_;  // placement of (first device, tp, dp)
  std::map<std::pair<int64_t, int64_t>, BoundaryLink> boundaries_;  // by the two stages' placements
  std::map<std::pair<int64_t, int64_t>, double> tied_tables_;       // by the first and last placements
  std::unordered_map<SlotKey, SlotOptionSets, KeyHash> option_sets_;
  std::vector<const std::vector<StageOption>*> option_table_;  // (stage, units) of the structure in solve()
  // Tables of split_min_sum, kept between calls to save allocations.
  struct Scratch {
    std::vector<double> best;
    std::vector<int> take;
    std::vector<const StageOption*> pick;
    std::vector<const StageOption*> under_cap;
    std::vector<double> fastest;
    std::vector<int> k_end;
    std::vector<double> worst;
    std::vector<StageRate> stage_rates;  // of the structure last given to refined_lower_bound
    std::vector<int> k_limit;
  } scratch_;
};

}  // namespace

SearchResult plan_search(const CostModel& cost, const SearchOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  search_options_validate(cost, options);
  const ClusterSpec& cluster = cost.cluster();
  const std::vector<TypePool> pools = type_pools(cluster);
  StructureBounds structure_bounds(cost, options);
  std::vector<Structure> structures = structures_enumerate(cost, pools, options, structure_bounds);
  // One stage over devices of several types (e.g. a pinned dp that spans them) is no structure.
  std::optional<Plan> uneven = uneven_dp_best(cost, options);
  if (structures.empty() && !uneven)
    throw Error("no layout matches the pinned choices on this cluster", {"", ""},
                fmt::format("check that tp divides the devices per node and is one model {} runs with ({}), that "
                            "tp x dp x pp uses each device type fully, and that the batch divides into the pinned "
                            "micro-batches and dp",
                            cost.model().name, tp_runnable_list(cost.model(), kMaxTensorParallelism)));
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
  std::vector<std::unique_ptr<Searcher>> searchers;
  for (int t = 0; t < options.threads; ++t) searchers.push_back(std::make_unique<Searcher>(cost, options));
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
  auto evaluate = [&](Searcher& searcher, const Structure& s, double threshold) {
    Outcome out;
    const double factor = score_factor(s);
    std::vector<SlotInfo> slots = searcher.slots(s, pools);
    double slowest_stage_bound = 0;
    const double refined = searcher.refined_lower_bound(s, slots, &slowest_stage_bound);
    if (refined * factor >= threshold) {
      out.refined_pruned = true;
      return out;
    }
    bool limited = false;
    out.solution = searcher.solve(s, slots, threshold / factor, refined, slowest_stage_bound, &limited);
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
