// One candidate structure solved exactly: its stages placed on devices, a lower bound from the
// placed stages, and the best layer split with each stage's choices (dynamic programming on the
// bottleneck). Caches what structures share: per-layer costs, option sets, boundary links.
#include "search/structure_solver.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "cost/moe_cost.hpp"
#include "cost/network_paths.hpp"
#include "cost/runtime_traits.hpp"
#include "search/expert_options.hpp"
#include "search/expert_placement.hpp"
#include "search/split_bound.hpp"

namespace alloy {

namespace {

constexpr double kUnbounded = std::numeric_limits<double>::infinity();

// Most units a stage may take when its steady state and per-step overhead together may take
// `room` seconds: a (fixed + k unit) + max(floor, fixed' + k unit') <= room (a small slack keeps
// counts at the edge).
double stage_most_units(const StageRate& rate, const OverheadRate& overhead, double a, double room) {
  constexpr double kEdge = 1 + 1e-9;
  double most = std::numeric_limits<double>::infinity();
  const double steady = a * rate.unit_seconds;
  if (steady > 0) most = std::floor((room - overhead.floor_seconds - a * rate.fixed_seconds) / steady * kEdge);
  const double together = steady + overhead.unit_seconds;
  if (together > 0)
    most = std::min(most, std::floor((room - overhead.fixed_seconds - a * rate.fixed_seconds) / together * kEdge));
  return most;
}

}  // namespace

StructureSolver::StructureSolver(const CostModel& cost, const SearchOptions& options) : cost_(cost), options_(options) {
  pins_.zero = options.zero;
  pins_.shard_gradients = options.shard_gradients ? (*options.shard_gradients ? 1 : 0) : -1;
  pins_.sequence_parallel = options.sequence_parallel ? (*options.sequence_parallel ? 1 : 0) : -1;
  pins_.recompute = options.recompute ? static_cast<int>(*options.recompute) : -1;
  pins_.allow_offload = options.allow_offload;
  pins_.prefetch_depth = options.prefetch_depth;
  pins_.offload_activations = options.offload_activations;
  dense_layers_ = model_is_moe(cost.model()) ? static_cast<int>(cost.model().moe.first_dense_layers) : 0;
}

const StageUnitCosts* StructureSolver::unit(const StageShape& shape, UnitKey key) {
  auto it = units_.find(key);
  if (it == units_.end()) it = units_.emplace(key, cost_.unit_costs(shape, key.sp == 1)).first;
  return &it->second;
}

SlotOptionSets& StructureSolver::option_sets(const SlotInfo& info, int leading) {
  SlotKey key{info.unit_key, info.slot.in_flight, info.slot.boundary_seconds, info.slot.chunks_sent,
              (info.slot.has_embedding ? 1 : 0) | (info.slot.has_head ? 2 : 0) |
                  (info.slot.head_holds_lm_matrix ? 4 : 0) | (info.slot.has_next ? 8 : 0),
              info.slot.micro_batches, leading, info.slot.virtual_chunks,
              info.slot.virtual_chunks > 1 ? info.slot.pipeline_stages : 0};
  auto it = option_sets_.find(key);
  if (it == option_sets_.end())
    it = option_sets_.emplace(key, SlotOptionSets(static_cast<int>(cost_.model().num_layers))).first;
  return it->second;
}

const std::vector<StageOption>& StructureSolver::options(const SlotInfo& info, int leading, SlotOptionSets& sets,
                                                         int blocks) {
  std::vector<StageOption>& set = sets.sets[blocks];
  if (!sets.computed[blocks]) {
    ++stats.stage_option_sets;
    StageSlot slot = slot_with_blocks(info.slot, blocks);
    if (model_is_moe(cost_.model())) {
      slot.leading_dense_blocks = leading;
      stage_options_over_ep(cost_, slot, info.at_ep, blocks, pins_, &set);
    } else {
      stage_options(cost_, slot, blocks, pins_, &set);
    }
    sets.computed[blocks] = 1;
  }
  return set;
}

std::pair<int, int> StructureSolver::stage_leading_range(int st, int p, int units, int unit, int fewest) const {
  // Offsets in units: every stage before takes at least `fewest`, or its pinned count.
  int first = st * fewest, last = units - (p - st) * fewest;
  if (!options_.layer_split.empty()) {
    first = 0;
    for (int i = 0; i < st; ++i) first += options_.layer_split[i] / unit;
    last = first;
  }
  return {leading_dense_from(last), leading_dense_from(first)};
}

void StructureSolver::add_expert_degrees(SlotInfo* info, int dp, bool plain_allowed, bool sp_allowed) {
  const int experts = static_cast<int>(cost_.model().moe.num_experts);
  for (int ep : stage_ep_degrees(dp, experts, options_.ep)) {
    SlotAtEp a;
    a.ep = ep;
    a.shape = info->slot.shape;
    // Priced as the even split prices it (plan evaluation does so while the placement is
    // even), so a chosen plan fits before expert_placement_refine places experts by load.
    moe_shape_set(cost_, &a.shape, slot_device_ids(*info), ep, static_cast<double>(experts) / ep, 0, 0,
                  moe_even_split_skew(cost_.expert_token_shares(), ep));
    UnitKey k = info->unit_key;
    k.ep = ep;
    k.links = link_ids_.id({&a.shape.dp_group, &a.shape.ep_group, &a.shape.expert_dp_group});
    if (plain_allowed) a.unit[0] = unit(a.shape, k);
    k.sp = 1;
    if (sp_allowed) a.unit[1] = unit(a.shape, k);
    info->at_ep.push_back(std::move(a));
  }
}

std::vector<int> slot_device_ids(const SlotInfo& info) { return {info.device_ids.begin(), info.device_ids.end()}; }

const BoundaryLink& StructureSolver::boundary(const SlotInfo& from, const SlotInfo& to) {
  const std::pair<int64_t, int64_t> key{from.placement, to.placement};
  auto it = boundaries_.find(key);
  if (it == boundaries_.end()) it = boundaries_.emplace(key, cost_.boundary_link(slot_device_ids(from), slot_device_ids(to))).first;
  return it->second;
}

double StructureSolver::tied_table(const SlotInfo& first, const SlotInfo& last) {
  const std::pair<int64_t, int64_t> key{first.placement, last.placement};
  auto it = tied_tables_.find(key);
  if (it == tied_tables_.end())
    it = tied_tables_
             .emplace(key, network_tied_table_seconds(cost_.cluster(), cost_.model(),
                                                      static_cast<int>(cost_.gradient_wire_bytes(0)), slot_device_ids(first),
                                                      first.slot.shape.tp, slot_device_ids(last), last.slot.shape.tp))
             .first;
  return it->second;
}

std::vector<SlotInfo> StructureSolver::slots(const Structure& s, const std::vector<TypePool>& pools) {
  const int p = s.num_stages();
  const int64_t micro = s.micro_batch_sequences();
  std::vector<SlotInfo> out;
  for (const TypeGroup& g : *s.groups) {
    const TypePool* pool = nullptr;
    for (const TypePool& tp : pools)
      if (tp.device_type == g.device_type) pool = &tp;
    const int size = g.tp * g.dp;
    // The same for every stage of the group: its replicas' tokens split over tp or not.
    const bool sp_allowed = g.tp > 1 && pins_.sequence_parallel != 0 &&
                            group_sequence_parallel_runnable(g, micro, cost_.train().seq_len);
    const bool plain_allowed = pins_.sequence_parallel != 1 || g.tp == 1;
    for (int j = 0; j < g.stages; ++j) {
      SlotInfo info;
      info.device_ids = std::span<const int>(pool->device_ids).subspan(static_cast<size_t>(j) * size, size);
      StageSlot& slot = info.slot;
      // Stages start at multiples of their size in the type's devices: first id, tp, dp
      // identify the placement.
      info.placement = (static_cast<int64_t>(info.device_ids.front()) * 4096 + g.tp) * 65536 + g.dp;
      auto cached = shapes_.find(info.placement);
      if (cached == shapes_.end()) {
        PlacedShape placed;
        placed.shape = cost_.stage_shape(slot_device_ids(info), g.tp, g.dp, 1);
        placed.reduce = cost_.stage_gradient_reduce_bound(placed.shape);
        placed.links = link_ids_.id({&placed.shape.dp_group});
        cached = shapes_.emplace(info.placement, std::move(placed)).first;
      }
      slot.shape = cached->second.shape;
      info.reduce = cached->second.reduce;
      slot.shape.micro_batch = micro / g.dp;
      info.unit_key = {g.device_type, g.tp, g.dp, slot.shape.dp_group.nodes, slot.shape.dp_group.concurrent_per_node,
                       0, micro / g.dp, 1, cached->second.links};
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
    slot.pipeline_stages = p;
    slot.stage_index = i;
    slot.micro_batches = s.micro_batches;
    slot.has_next = p > 1;
    slot.has_embedding = i == 0;
    slot.has_head = i == p - 1;
    // Its leading dense blocks depend on where its blocks start: set per split (options()).
    slot.virtual_chunks = s.virtual_chunks;
    slot.round_blocks = static_cast<int>(cost_.model().num_layers) / s.virtual_chunks;
    slot.head_holds_lm_matrix = !(cost_.model().tied_embeddings && p == 1);
    const int next = (i + 1) % p;
    if (next != i && (i + 1 < p || s.virtual_chunks > 1)) {
      const StageUnitCosts* u = slot.unit[0] ? slot.unit[0] : slot.unit[1];
      // Where the runtime sends sequence shards and both stages may run sequence parallelism, the
      // cheaper sends (the plan's evaluation prices the stages' final choice).
      const bool shards =
          runtime_traits(cost_.cluster().device_types[slot.shape.device_type]).pipeline_sends_sequence_shards &&
          slot.unit[1] != nullptr && out[next].slot.unit[1] != nullptr;
      slot.boundary_seconds = boundary_transfer_seconds(u->boundary_bytes, boundary(out[i], out[next]),
                                                        slot.shape.tp, out[next].slot.shape.tp, shards);
      slot.chunks_sent = i + 1 < p ? s.virtual_chunks : s.virtual_chunks - 1;
    }
    if (p > 1) slot.chunks_received = i > 0 ? s.virtual_chunks : s.virtual_chunks - 1;
  }
  if (p > 1) out[0].slot.tied_table_seconds = out[p - 1].slot.tied_table_seconds = tied_table(out[0], out[p - 1]);
  return out;
}

bool StructureSolver::split_min_sum(const Structure& s, std::vector<SlotInfo>& slot_infos, double cap, const std::vector<int>& k_limit, std::vector<int>* blocks, std::vector<StageOption>* chosen, double* sum) {
  ++stats.split_solves;
  const int p = static_cast<int>(slot_infos.size());
  const int unit = s.split_unit;
  const int units = static_cast<int>(cost_.model().num_layers) / unit;
  const int fewest = s.min_stage_blocks() / unit;  // units per stage at least
  const size_t width = static_cast<size_t>(units) + 1;
  const int variants = dense_layers_ + 1;  // leading dense blocks from a stage's first: 0..dense_layers_
  std::vector<double>& best = scratch_.best;
  best.assign((p + 1) * width, kUnbounded);
  std::vector<int>& take = scratch_.take;
  take.assign((p + 1) * width, 0);
  std::vector<const StageOption*>& pick = scratch_.pick;
  pick.assign((p + 1) * width, nullptr);
  const size_t cells = static_cast<size_t>(p) * variants * width;
  if (option_table_.size() != cells) option_table_.assign(cells, nullptr);
  best[0] = 0;
  // Per stage and leading dense blocks (an MoE model's stage prices by where its blocks start),
  // the fastest option under the cap for each layer count. A stage with more blocks is dominated
  // option by option by one with fewer (less memory, time and overhead), so the first count
  // without an option fitting memory ends the list, and with equal chunks (the same
  // steady-state factor for every count) the first without one under the cap; with unequal
  // chunks the factor varies with the count, and later counts may fit.
  std::vector<const StageOption*>& under_cap = scratch_.under_cap;
  under_cap.assign(cells, nullptr);
  std::vector<int>& k_max = scratch_.k_max;
  k_max.assign(static_cast<size_t>(p) * variants, 0);
  std::vector<int> most(p + 1, 0);  // per stage, over its variants
  for (int st = 0; st < p; ++st) {
    const int k_first = options_.layer_split.empty() ? fewest : options_.layer_split[st] / unit;
    const int k_last =
        std::min(k_limit[st], options_.layer_split.empty() ? units - (p - 1) * fewest : options_.layer_split[st] / unit);
    const auto [lead_lo, lead_hi] = stage_leading_range(st, p, units, unit, fewest);
    for (int lead = lead_lo; lead <= lead_hi; ++lead) {
      SlotOptionSets* sets = nullptr;
      for (int k = k_first; k <= k_last; ++k) {
        const std::vector<StageOption>*& cached = option_table_[option_cell(st, lead, k, width)];
        if (!cached) {
          if (!sets) sets = &option_sets(slot_infos[st], lead);
          cached = &options(slot_infos[st], lead, *sets, k * unit);
        }
        if (cached->empty()) break;
        const double a = s.micro_batches - stage_fill_fraction(k * unit, s.virtual_chunks);
        const StageOption* found = nullptr;
        for (const StageOption& o : *cached)
          if (a * o.t + o.u + slot_infos[st].slot.tied_table_seconds <= cap) {
            found = &o;
            break;
          }
        if (!found && unit == s.virtual_chunks) break;
        if (!found) continue;
        under_cap[option_cell(st, lead, k, width)] = found;
        k_max[static_cast<size_t>(st) * variants + lead] = k;
      }
      most[st] = std::max(most[st], k_max[static_cast<size_t>(st) * variants + lead]);
    }
    if (most[st] == 0) return false;
  }
  // Most units the stages from st on can take, for pruning splits that cannot finish.
  std::vector<int> suffix(p + 1, 0);
  for (int st = p - 1; st >= 0; --st) suffix[st] = suffix[st + 1] + most[st];
  for (int st = 0; st < p; ++st) {
    const int remaining_after = (p - st - 1) * fewest;  // units the later stages take at least
    for (int j = 0; j + remaining_after < units; ++j) {
      const double base = best[st * width + j];
      if (base == kUnbounded) continue;
      const int lead = leading_dense_from(j);
      const int k_lo = std::max(fewest, units - j - suffix[st + 1]);
      const int k_hi = std::min(k_max[static_cast<size_t>(st) * variants + lead], units - j - remaining_after);
      for (int k = k_lo; k <= k_hi; ++k) {
        const StageOption* found = under_cap[option_cell(st, lead, k, width)];
        if (!found) continue;  // below a pinned split, or over the cap
        const size_t cell = (st + 1) * width + j + k;
        const double total = base + stage_fill_fraction(k * unit, s.virtual_chunks) * found->t;
        if (total < best[cell]) {
          best[cell] = total;
          take[cell] = k;
          pick[cell] = found;
        }
      }
    }
  }
  if (best[p * width + units] == kUnbounded) return false;
  blocks->assign(p, 0);
  chosen->assign(p, StageOption{});
  int j = units;
  for (int st = p; st > 0; --st) {
    const size_t cell = st * width + j;
    (*blocks)[st - 1] = take[cell] * unit;
    (*chosen)[st - 1] = *pick[cell];
    j -= take[cell];
  }
  *sum = best[p * width + units];
  return true;
}

std::optional<Solution> StructureSolver::solve(const Structure& s, std::vector<SlotInfo>& slot_infos,
                                               double threshold_seconds, double bound, double bottleneck_bound,
                                               bool* limited) {
  option_table_.clear();
  const int v = s.virtual_chunks;
  const int p = static_cast<int>(slot_infos.size());
  const int units = static_cast<int>(cost_.model().num_layers) / s.split_unit;
  std::vector<int>& k_limit = scratch_.k_limit;
  k_limit.assign(p, units);
  *limited = false;
  if (threshold_seconds < kUnbounded) {
    const double room = threshold_seconds - (bound - bottleneck_bound);  // for the slowest stage
    for (int st = 0; st < p; ++st) {
      const double most = stage_most_units(scratch_.stage_rates[st], scratch_.overheads[st], s.min_steady_factor(), room);
      if (most < units) {
        k_limit[st] = static_cast<int>(std::max(0.0, most));
        *limited = true;
      }
    }
  }
  std::optional<Solution> best;
  double cap = kUnbounded;
  std::vector<int> blocks;
  std::vector<StageOption> chosen;
  bool exact_bottleneck = false;
  while (true) {
    double sum = 0;
    if (!split_min_sum(s, slot_infos, cap, k_limit, &blocks, &chosen, &sum)) break;
    double bottleneck = 0;
    for (size_t st = 0; st < chosen.size(); ++st)
      bottleneck = std::max(bottleneck, (s.micro_batches - stage_fill_fraction(blocks[st], v)) * chosen[st].t +
                                            chosen[st].u + slot_infos[st].slot.tied_table_seconds);
    const double step = sum + bottleneck;
    if (!best || step < best->step_seconds) {
      best = Solution{s.index, step, step, blocks, chosen};
    }
    const double target = std::min(best->step_seconds, threshold_seconds);
    if (sum + bottleneck_bound >= target) break;
    // The first solve filled every (stage, count) option set: the exact smallest bottleneck
    // over all splits bounds every later one. Priced only when the cheap bound falls short.
    if (!exact_bottleneck) {
      bottleneck_bound = std::max(bottleneck_bound, min_bottleneck(s, slot_infos));
      exact_bottleneck = true;
      if (sum + bottleneck_bound >= target) break;
    }
    cap = std::nextafter(bottleneck, 0.0);
  }
  return best;
}

double StructureSolver::min_bottleneck(const Structure& s, const std::vector<SlotInfo>& slot_infos) {
  const int p = static_cast<int>(slot_infos.size());
  const int unit = s.split_unit;
  const int units = static_cast<int>(cost_.model().num_layers) / unit;
  const size_t width = static_cast<size_t>(units) + 1;
  const int variants = dense_layers_ + 1;
  // Per (stage, leading dense blocks, count): the stage's smallest (m - f) t + u; NaN where the
  // structure does not allow the count (pinned split, fewer blocks than chunks) or no split
  // starts the stage there. Counts end at the first without an option (more blocks need more
  // memory).
  std::vector<double>& fastest = scratch_.fastest;
  fastest.assign(static_cast<size_t>(p) * variants * width, kUnbounded);
  std::vector<int>& k_end = scratch_.k_end;
  k_end.assign(static_cast<size_t>(p) * variants, units + 1);
  for (int st = 0; st < p; ++st)
    for (int lead = 0; lead < variants; ++lead)
      for (int k = 1; k <= units; ++k) {
        const size_t cell = option_cell(st, lead, k, width);
        const std::vector<StageOption>* set = option_table_[cell];
        if (!set) {
          fastest[cell] = std::numeric_limits<double>::quiet_NaN();
          continue;
        }
        if (set->empty()) {
          k_end[static_cast<size_t>(st) * variants + lead] = k;
          break;
        }
        const double a = s.micro_batches - stage_fill_fraction(k * unit, s.virtual_chunks);
        for (const StageOption& o : *set)
          fastest[cell] = std::min(fastest[cell], a * o.t + o.u + slot_infos[st].slot.tied_table_seconds);
      }
  std::vector<double>& worst = scratch_.worst;
  worst.assign((p + 1) * width, kUnbounded);
  worst[0] = 0;
  for (int st = 0; st < p; ++st)
    for (int j = 0; j < units; ++j) {
      const double before = worst[st * width + j];
      if (before == kUnbounded) continue;
      const int lead = leading_dense_from(j);
      const int k_last = std::min(units - j, k_end[static_cast<size_t>(st) * variants + lead] - 1);
      for (int k = 1; k <= k_last; ++k) {
        const double g = fastest[option_cell(st, lead, k, width)];
        if (std::isnan(g)) continue;
        double& cell = worst[(st + 1) * width + j + k];
        cell = std::min(cell, std::max(before, g));
      }
    }
  return worst[p * width + units];
}

double StructureSolver::refined_lower_bound(const Structure& s, const std::vector<SlotInfo>& slot_infos,
                                            double* bottleneck) {
  const int v = s.virtual_chunks;
  const int unit = s.split_unit;
  const int layers = static_cast<int>(cost_.model().num_layers);
  const int units = layers / unit;
  const int p = static_cast<int>(slot_infos.size());
  std::vector<StageRate>& stages = scratch_.stage_rates;
  std::vector<OverheadRate>& overheads = scratch_.overheads;
  stages.assign(p, StageRate{1, kUnbounded, kUnbounded});
  overheads.assign(p, OverheadRate{kUnbounded, kUnbounded, kUnbounded});
  double fixed_sum = 0;
  double fastest = kUnbounded;
  for (int i = 0; i < p; ++i) {
    const StageSlot& slot = slot_infos[i].slot;
    double per_block = kUnbounded;
    OverheadRate& overhead = overheads[i];
    for (const StageUnitCosts* u : slot.unit) {
      if (!u) continue;
      per_block = std::min(per_block, u->block.forward_seconds + u->block.backward_seconds);
      // An MoE model's leading dense blocks may sit on any stage: the faster kind bounds.
      if (dense_layers_ > 0)
        per_block = std::min(per_block, u->dense_block.times.forward_seconds + u->dense_block.times.backward_seconds);
      double f = 2.0 * slot.chunks_sent * slot.boundary_seconds;
      if (slot.has_embedding) f += u->embedding.forward_seconds + u->embedding.backward_seconds;
      if (slot.has_head) f += u->head.forward_seconds + u->head.backward_seconds;
      stages[i].fixed_seconds = std::min(stages[i].fixed_seconds, f);
      const OverheadRate sync = sync_overhead_per_unit(
          cost_.stage_gradient_sync_bound(slot_infos[i].reduce, *u, slot.has_embedding, slot.has_head), unit);
      overhead = {std::min(overhead.floor_seconds, sync.floor_seconds), std::min(overhead.fixed_seconds, sync.fixed_seconds),
                  std::min(overhead.unit_seconds, sync.unit_seconds)};
    }
    // The first and last stage also sum the table tied between them, every step.
    overhead.floor_seconds += slot.tied_table_seconds;
    overhead.fixed_seconds += slot.tied_table_seconds;
    stages[i].unit_seconds = unit * per_block;
    fixed_sum += stages[i].fixed_seconds + v * per_block;
    fastest = std::min(fastest, per_block);
  }
  *bottleneck = split_step_bottleneck_bound(stages, overheads, s.min_steady_factor(), units);
  const double sum = fixed_sum + (layers - p * v) * fastest;
  return sum / v + *bottleneck;
}

double StructureSolver::frugal_memory_ratio(const Structure& s, std::vector<SlotInfo>& slot_infos, double* bytes, int* type, HostShortfall* host) {
  const int p = static_cast<int>(slot_infos.size());
  const int unit = s.split_unit;
  const int units = static_cast<int>(cost_.model().num_layers) / unit;
  double worst = 0;
  HostShortfall need{0, 0, 0};
  int offset = 0;  // units before the stage
  for (int st = 0; st < p; ++st) {
    const int k = (units / p + (st < units % p ? 1 : 0)) * unit;
    StageSlot slot = slot_with_blocks(slot_infos[st].slot, k);
    slot.leading_dense_blocks = leading_dense_from(offset);
    offset += k / unit;
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
  if (worst > 1 && need.ratio > 1 && need.ratio < kUnbounded && need.ratio < host->ratio) *host = need;
  return worst;
}

}  // namespace alloy
