#include "search/layouts.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <unordered_map>
#include <numeric>

#include <fmt/format.h>

#include "cost/runtime_traits.hpp"
#include "plan/runnable.hpp"
#include "search/split_bound.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace {

// Beyond this many (layout, batching, schedule) candidates the enumeration itself would need
// gigabytes; the planner asks for pins instead.
constexpr size_t kMaxStructures = 4'000'000;

// Global batches to try: the given one, or up to 32 evenly spaced values in [min, max].
std::vector<int64_t> batch_candidates(const TrainSpec& train) {
  if (train.min_global_batch <= 0 || train.max_global_batch <= 0) return {train.global_batch_sequences};
  const int64_t lo = train.min_global_batch;
  const int64_t hi = std::max(lo, train.max_global_batch);
  const int64_t stride = std::max<int64_t>(1, (hi - lo + 31) / 32);
  std::vector<int64_t> out;
  for (int64_t g = hi; g >= lo; g -= stride) out.push_back(g);
  return out;
}

struct ShapeOption {
  int tp = 1;
  int stages = 1;
  int dp = 1;
};

// Every (tp, stages, dp) of a type's devices that the pins allow and the runtime runs.
std::vector<ShapeOption> shape_options(const TypePool& pool, const ModelSpec& model, const SearchOptions& o,
                                       int max_stages) {
  std::vector<ShapeOption> out;
  const int n = static_cast<int>(pool.device_ids.size());
  for (int tp = 1; tp <= pool.devices_per_node; tp *= 2) {
    if (pool.devices_per_node % tp != 0 || n % tp != 0 || !tp_runnable(model, tp).ok) continue;
    if (o.tp > 0 && tp != o.tp) continue;
    for (int k = 1; k <= std::min(n / tp, max_stages); ++k) {
      if ((n / tp) % k != 0) continue;
      const int dp = n / tp / k;
      if (o.dp > 0 && dp != o.dp) continue;
      out.push_back({tp, k, dp});
    }
  }
  return out;
}

// Pinned sequence parallelism: every group with tp > 1 must split its replicas' tokens.
bool sequence_parallel_fits(const std::vector<TypeGroup>& groups, int64_t micro_batch, int64_t seq_len) {
  for (const TypeGroup& g : groups)
    if (g.tp > 1 && !group_sequence_parallel_runnable(g, micro_batch, seq_len)) return false;
  return true;
}

int64_t lcm64(int64_t a, int64_t b) { return a / std::gcd(a, b) * b; }

// Whether a pinned layer split (empty: none) gives every stage at least one block per chunk.
bool split_holds_chunks(const std::vector<int>& layer_split, int v) {
  return std::all_of(layer_split.begin(), layer_split.end(), [&](int n) { return n >= v; });
}

// Whether every stage can take whole units of v blocks: the layers, and a pinned split, divide by v.
bool split_divides(int layers, const std::vector<int>& layer_split, int v) {
  return layers % v == 0 && std::all_of(layer_split.begin(), layer_split.end(), [&](int n) { return n % v == 0; });
}

int factorial(int n) { return n <= 1 ? 1 : n * factorial(n - 1); }

// A type group's (type, tp, dp), which fix its stages and their devices.
int64_t type_group_key(const TypeGroup& g) { return (static_cast<int64_t>(g.dp) * 64 + g.tp) * 64 + g.device_type; }

}  // namespace

bool group_sequence_parallel_runnable(const TypeGroup& group, int64_t micro_batch, int64_t seq_len) {
  StageLayout layout;
  layout.tp = group.tp;
  layout.dp = group.dp;
  layout.sequence_parallel = true;
  layout.replica_tokens.assign(static_cast<size_t>(group.dp), micro_batch / group.dp * seq_len);
  return stage_features_runnable(layout).ok;
}

double Structure::min_steady_factor() const {
  const double largest_fill = split_unit == virtual_chunks ? 1.0 / virtual_chunks : 2.0 / (virtual_chunks + 1);
  return micro_batches - largest_fill;
}

int Structure::num_stages() const {
  int p = 0;
  for (const TypeGroup& g : *groups) p += g.stages;
  return p;
}

std::vector<TypePool> type_pools(const ClusterSpec& cluster) {
  std::vector<TypePool> pools(cluster.device_types.size());
  std::vector<int> quantum(cluster.device_types.size(), 0);
  for (size_t t = 0; t < pools.size(); ++t) pools[t].device_type = static_cast<int>(t);
  for (const Device& d : cluster.devices) pools[d.device_type_index].device_ids.push_back(d.id);
  for (const NodeGroup& g : cluster.node_groups)
    if (g.device_type_index >= 0 && g.count > 0)
      quantum[g.device_type_index] = std::gcd(quantum[g.device_type_index], g.devices_per_node);
  std::vector<TypePool> out;
  for (size_t t = 0; t < pools.size(); ++t) {
    if (pools[t].device_ids.empty()) continue;
    std::sort(pools[t].device_ids.begin(), pools[t].device_ids.end());
    pools[t].devices_per_node = std::max(1, quantum[t]);
    out.push_back(pools[t]);
  }
  return out;
}

std::string structure_layout_key(const Structure& s, const ClusterSpec& cluster) {
  std::string key;
  for (const TypeGroup& g : *s.groups) {
    if (!key.empty()) key += " | ";
    key += fmt::format("{} tp{} dp{} x{}", cluster.device_types[g.device_type].name, g.tp, g.dp, g.stages);
  }
  return key;
}

OverheadRate sync_overhead_per_unit(const GradientSyncBound& sync, int unit) {
  return {sync.floor_seconds, sync.fixed_seconds, unit * sync.per_block_seconds};
}

StructureBounds::StructureBounds(const CostModel& cost, const SearchOptions& options, const std::vector<TypePool>& pools)
    : cost_(cost), options_(options), pools_(pools) {}

int StructureBounds::sequence_parallel_mask(int tp) const {
  const bool sp_only = options_.sequence_parallel.has_value() && *options_.sequence_parallel && tp > 1;
  const bool sp_allowed = tp > 1 && options_.sequence_parallel.value_or(true);
  return (sp_only ? 0 : 1) | (sp_allowed ? 2 : 0);
}

LayerSecondsBound StructureBounds::layer_time(int type, int tp, int64_t per_replica_batch) {
  const int64_t key = (per_replica_batch * 64 + tp) * 64 + type;
  auto it = layer_seconds_.find(key);
  if (it != layer_seconds_.end()) return it->second;
  const int mask = sequence_parallel_mask(tp);
  LayerSecondsBound t = cost_.layer_seconds_bound(type, tp, per_replica_batch, (mask & 1) == 0);
  if (mask == 3) {
    const LayerSecondsBound with_sp = cost_.layer_seconds_bound(type, tp, per_replica_batch, true);
    t = {std::min(t.block, with_sp.block), std::min(t.embedding, with_sp.embedding), std::min(t.head, with_sp.head)};
  }
  layer_seconds_.emplace(key, t);
  return t;
}

std::vector<int> StructureBounds::stage_devices(const TypeGroup& g, int i) const {
  const size_t size = static_cast<size_t>(g.tp) * g.dp;
  for (const TypePool& pool : pools_)
    if (pool.device_type == g.device_type)
      return {pool.device_ids.begin() + static_cast<std::ptrdiff_t>(i * size),
              pool.device_ids.begin() + static_cast<std::ptrdiff_t>((i + 1) * size)};
  return {};
}

const StructureBounds::GroupSync& StructureBounds::group_sync(const TypeGroup& g, int64_t per_replica_batch) {
  const int64_t group_key = type_group_key(g);
  const int64_t key = per_replica_batch * (int64_t{1} << 28) + group_key;
  auto it = group_sync_.find(key);
  if (it != group_sync_.end()) return it->second;
  auto reduce = group_reduce_.find(group_key);
  if (reduce == group_reduce_.end()) {
    // The least over the group's placements: any of its stages may take any count of blocks.
    GradientReduceBound least = cost_.stage_gradient_reduce_bound(cost_.stage_shape(stage_devices(g, 0), g.tp, g.dp, 1));
    for (int i = 1; i < g.stages; ++i) {
      const GradientReduceBound r = cost_.stage_gradient_reduce_bound(cost_.stage_shape(stage_devices(g, i), g.tp, g.dp, 1));
      least = {std::min(least.one_block_seconds, r.one_block_seconds), std::min(least.fixed_seconds, r.fixed_seconds),
               std::min(least.per_block_seconds, r.per_block_seconds)};
    }
    reduce = group_reduce_.emplace(group_key, least).first;
  }
  GroupSync sync{};  // no reduction: nothing to bound
  const GradientReduceBound& r = reduce->second;
  if (r.one_block_seconds <= 0 && r.fixed_seconds <= 0 && r.per_block_seconds <= 0)
    return group_sync_.emplace(key, sync).first->second;
  // Block times do not depend on the placement: one replica's tp group prices them.
  std::vector<int> replica = stage_devices(g, 0);
  replica.resize(static_cast<size_t>(g.tp));
  const StageShape shape = cost_.stage_shape(replica, g.tp, 1, per_replica_batch);
  const int mask = sequence_parallel_mask(g.tp);
  for (int sp = 0; sp < 2; ++sp) {
    if (!(mask & (1 << sp))) continue;
    const StageUnitCosts unit = cost_.unit_costs(shape, sp == 1);
    const bool first = sp == 0 || !(mask & 1);
    for (int flags = 0; flags < 4; ++flags) {
      const GradientSyncBound b = cost_.stage_gradient_sync_bound(r, unit, flags & 1, flags & 2);
      GradientSyncBound& out = sync[flags];
      out = first ? b
                  : GradientSyncBound{std::min(out.floor_seconds, b.floor_seconds), std::min(out.fixed_seconds, b.fixed_seconds),
                                      std::min(out.per_block_seconds, b.per_block_seconds)};
    }
  }
  return group_sync_.emplace(key, sync).first->second;
}

// Whether a group's runtime may send sequence shards across its boundaries: then the bounds take
// the cheaper sends, whether or not its stages end up sequence-parallel.
bool StructureBounds::sends_sequence_shards(const TypeGroup& group) const {
  return runtime_traits(cost_.cluster().device_types[group.device_type]).pipeline_sends_sequence_shards;
}

double StructureBounds::group_send_seconds(const TypeGroup& from, const TypeGroup& to, double bytes) {
  const auto key = std::make_pair(type_group_key(from), type_group_key(to));
  auto it = group_links_.find(key);
  if (it == group_links_.end())
    it = group_links_.emplace(key, cost_.boundary_link(stage_devices(from, from.stages - 1), stage_devices(to, 0))).first;
  return boundary_transfer_seconds(bytes, it->second, from.tp, to.tp, sends_sequence_shards(from));
}

const StructureBounds::InnerSends& StructureBounds::group_inner_sends(const TypeGroup& g, int64_t micro, double bytes) {
  const int64_t group_key = type_group_key(g);
  const int64_t key = micro * (int64_t{1} << 28) + group_key;
  auto it = inner_sends_.find(key);
  if (it != inner_sends_.end()) return it->second;
  auto links = inner_links_.find(group_key);
  if (links == inner_links_.end()) {
    std::vector<BoundaryLink> each;
    for (int i = 0; i + 1 < g.stages; ++i) each.push_back(cost_.boundary_link(stage_devices(g, i), stage_devices(g, i + 1)));
    links = inner_links_.emplace(group_key, std::move(each)).first;
  }
  InnerSends sends;
  if (!links->second.empty()) sends.least_seconds = std::numeric_limits<double>::infinity();
  for (const BoundaryLink& link : links->second) {
    const double seconds = boundary_transfer_seconds(bytes, link, g.tp, g.tp, sends_sequence_shards(g));
    sends.least_seconds = std::min(sends.least_seconds, seconds);
    sends.total_seconds += seconds;
  }
  return inner_sends_.emplace(key, sends).first->second;
}

void StructureBounds::rates_append(const TypeGroup& g, double unit_seconds, const LayerSecondsBound& t,
                                   const GroupSync& sync, int unit, bool first_group, bool last_group,
                                   double inner_seconds, double sends_seconds) {
  const auto add = [&](int count, double fixed_seconds, int ends) {
    rates_.push_back({count, fixed_seconds, unit_seconds});
    overheads_.push_back(sync_overhead_per_unit(sync[ends], unit));
  };
  const double head = last_group ? t.head : 0;
  if (g.stages == 1) {
    add(1, (first_group ? t.embedding : 0) + head + sends_seconds, (first_group ? 1 : 0) | (last_group ? 2 : 0));
    return;
  }
  if (first_group) add(1, t.embedding + inner_seconds, 1);
  const int middle = g.stages - (first_group ? 1 : 0) - 1;
  if (middle > 0) add(middle, inner_seconds, 0);
  add(1, head + sends_seconds, last_group ? 2 : 0);
}

void StructureBounds::family_rates_append(const TypeGroup& g, double unit_seconds, const GroupSync& sync, int unit,
                                          double inner_seconds) {
  if (g.stages > 1) {
    rates_.push_back({g.stages - 1, inner_seconds, unit_seconds});
    overheads_.push_back(sync_overhead_per_unit(sync[3], unit));
  }
  rates_.push_back({1, 0, unit_seconds});
  overheads_.push_back(sync_overhead_per_unit(sync[3], unit));
}

void StructureBounds::set(Structure* s) {
  const int layers = static_cast<int>(cost_.model().num_layers);
  const int v = s->virtual_chunks;
  const int unit = s->split_unit;
  const int64_t micro = s->micro_batch_sequences();
  const std::vector<TypeGroup>& groups = *s->groups;
  rates_.clear();
  overheads_.clear();
  double fastest_block = std::numeric_limits<double>::infinity();
  double one_block_per_stage = 0;  // one block on every stage, each at its type's speed
  double end_layers = 0;           // the first stage's embedding and the last one's head
  double fewest_embedding = std::numeric_limits<double>::infinity();
  double fewest_head = std::numeric_limits<double>::infinity();
  int stages = 0;
  const int pipeline_stages = s->num_stages();
  double sends = 0;  // per micro-batch, both ways
  const double boundary_bytes =
      hidden_state_bytes(cost_.model(), micro, cost_.train().seq_len, cost_.train().precision);
  // Every stage sends every chunk of a micro-batch to the next stage and its gradient back; the
  // pipeline's last stage, when interleaved, all but one chunk to the first stage. Not for
  // Mixture-of-Experts models: their per-layer bound is ep 1's, which a stage at a larger ep can
  // beat, so their search is not exact, and a tighter bound would change which of their
  // near-best plans it reaches (docs/planner.md, Limits).
  const bool moe = model_is_moe(cost_.model());
  for (size_t g = 0; g < groups.size(); ++g) {
    const LayerSecondsBound t = layer_time(groups[g].device_type, groups[g].tp, micro / groups[g].dp);
    const GroupSync& sync = group_sync(groups[g], micro / groups[g].dp);
    const bool first = g == 0;
    const bool last = g + 1 == groups.size();
    const InnerSends inner = moe ? InnerSends{} : group_inner_sends(groups[g], micro, boundary_bytes);
    const double inner_each = 2.0 * v * inner.least_seconds;
    sends += 2.0 * v * inner.total_seconds;
    if (s->all_orders) {
      // A family's order is open: its embedding and head may sit on any group, its groups meet
      // in any order. The sends between groups are left to its orders' bounds: the least send
      // of each group to any other (a bound for every order) cost the 4096-GPU cases of
      // bench_planner more time per family than the orders it spared.
      family_rates_append(groups[g], unit * t.block, sync, unit, inner_each);
    } else {
      const int chunks = moe ? 0 : last ? (pipeline_stages > 1 ? v - 1 : 0) : v;
      const double group_sends =
          chunks > 0 ? 2.0 * chunks * group_send_seconds(groups[g], groups[last ? 0 : g + 1], boundary_bytes) : 0;
      rates_append(groups[g], unit * t.block, t, sync, unit, first, last, inner_each, group_sends);
      sends += group_sends;
    }
    if (first) end_layers += t.embedding;
    if (last) end_layers += t.head;
    fewest_embedding = std::min(fewest_embedding, t.embedding);
    fewest_head = std::min(fewest_head, t.head);
    fastest_block = std::min(fastest_block, t.block);
    one_block_per_stage += groups[g].stages * t.block;
    stages += groups[g].stages;
  }
  if (s->all_orders) end_layers = fewest_embedding + fewest_head;
  // Every stage's time is at least its layers' time: the sum over stages is at least v blocks
  // per stage at its own speed, the other blocks at the fastest type's, plus the embedding, the
  // head and the sends between stages, and its first chunk's share at least 1/v of it; the
  // slowest stage's steady state and per-step overhead together at least the best integer split's.
  s->bottleneck_bound_seconds = split_step_bottleneck_bound(rates_, overheads_, s->min_steady_factor(), layers / unit);
  s->lower_bound_seconds = (v * one_block_per_stage + (layers - stages * v) * fastest_block + end_layers + sends) / v +
                           s->bottleneck_bound_seconds;
}

std::vector<Structure> structure_orders(const Structure& family, StructureBounds& bounds) {
  const std::vector<TypeGroup>& groups = *family.groups;
  std::vector<int> order(groups.size());
  std::iota(order.begin(), order.end(), 0);
  std::vector<Structure> out;
  do {
    auto ordered = std::make_shared<std::vector<TypeGroup>>();
    for (int g : order) ordered->push_back(groups[g]);
    Structure s = family;
    s.groups = std::move(ordered);
    s.all_orders = false;
    s.orders = 1;
    bounds.set(&s);
    out.push_back(std::move(s));
  } while (std::next_permutation(order.begin(), order.end()));
  return out;
}

std::vector<Structure> structures_enumerate(const CostModel& cost, const std::vector<TypePool>& pools,
                                            const SearchOptions& o, StructureBounds& bounds) {
  const ClusterSpec& cluster = cost.cluster();
  const int layers = static_cast<int>(cost.model().num_layers);
  const int leading_dense = model_is_moe(cost.model()) ? static_cast<int>(cost.model().moe.first_dense_layers) : 0;
  const std::vector<int64_t> batches = batch_candidates(cost.train());

  // Pipeline orders of device types: the pinned one, or every ordered subset.
  std::vector<std::vector<int>> orders;  // indices into pools
  if (!o.device_order.empty()) {
    std::vector<int> order;
    for (const std::string& name : o.device_order) {
      int found = -1;
      for (size_t i = 0; i < pools.size(); ++i)
        if (cluster.device_types[pools[i].device_type].name == name) found = static_cast<int>(i);
      if (found < 0) throw Error("device type '" + name + "' is not in the cluster", {"", "device_order"},
                                 "name the cluster's device types, in pipeline order");
      order.push_back(found);
    }
    if (o.every_device && order.size() != pools.size())
      throw Error("--all-devices needs every device type in the pinned device order", {"", "device_order"},
                  "name every device type of the cluster in --device-order, or drop one of the two options");
    orders.push_back(order);
  } else {
    // Every subset once, as a family standing for all its pipeline orders: the orders share
    // their bound but for where the embedding and head sit, so each order becomes a structure
    // of its own only when the search reaches the family (structure_orders).
    const int n = static_cast<int>(pools.size());
    for (int mask = o.every_device ? (1 << n) - 1 : 1; mask < (1 << n); ++mask) {
      std::vector<int> members;
      for (int i = 0; i < n; ++i)
        if (mask & (1 << i)) members.push_back(i);
      orders.push_back(members);
    }
  }
  const bool families = o.device_order.empty();

  std::vector<std::vector<ShapeOption>> shapes(pools.size());
  for (size_t i = 0; i < pools.size(); ++i) shapes[i] = shape_options(pools[i], cost.model(), o, layers);

  std::vector<Schedule> schedules;
  if (o.schedule) schedules.push_back(*o.schedule);
  else schedules = {Schedule::Schedule_1f1b, Schedule::Schedule_interleaved};  // GPipe: same time, more memory
  std::vector<int> chunk_options = o.virtual_chunks > 0 ? std::vector<int>{o.virtual_chunks} : std::vector<int>{2, 4};

  std::vector<double> pool_price(pools.size(), 0);
  for (size_t i = 0; i < pools.size(); ++i)
    for (int id : pools[i].device_ids)
      pool_price[i] += cluster.node_group(cluster.devices[id]).price_per_device_hour / 3600.0;

  std::vector<Structure> out;
  std::vector<TypeGroup> groups;
  for (int64_t batch : batches) {
    std::vector<int> divisors;
    for (int64_t m = 1; m <= batch; ++m)
      if (batch % m == 0) divisors.push_back(static_cast<int>(m));
    for (const std::vector<int>& order : orders) {
      // Odometer over each type's shape options.
      std::vector<size_t> pick(order.size(), 0);
      bool empty = false;
      for (int idx : order) empty = empty || shapes[idx].empty();
      if (empty) continue;
      while (true) {
        groups.clear();
        int stages = 0;
        int64_t dp_lcm = 1;
        double price = 0;
        for (size_t g = 0; g < order.size(); ++g) {
          const ShapeOption& so = shapes[order[g]][pick[g]];
          groups.push_back({pools[order[g]].device_type, so.tp, so.stages, so.dp});
          stages += so.stages;
          dp_lcm = lcm64(dp_lcm, so.dp);
        }
        for (int idx : order) price += pool_price[idx];
        const bool stages_ok = stages <= layers && (o.pp == 0 || stages == o.pp) &&
                               (o.layer_split.empty() || static_cast<int>(o.layer_split.size()) == stages);
        // One copy of the layout, shared by its batching and schedule variants.
        const auto shared_groups = std::make_shared<const std::vector<TypeGroup>>(groups);
        for (int m : divisors) {
          if (!stages_ok) break;
          const int64_t micro = batch / m;
          if (micro % dp_lcm != 0) continue;
          if (o.sequence_parallel.value_or(false) && !sequence_parallel_fits(groups, micro, cost.train().seq_len)) continue;
          if (o.num_micro_batches > 0 && m != o.num_micro_batches) continue;
          if (o.micro_batch_sequences > 0 && micro != o.micro_batch_sequences) continue;
          for (Schedule sched : schedules) {
            std::vector<int> vs = {1};
            if (sched == Schedule::Schedule_interleaved) vs = chunk_options;
            for (int v : vs) {
              if (sched == Schedule::Schedule_interleaved &&
                  (stages < 2 || v < 2 || stages * v > layers || m % stages != 0 || !split_holds_chunks(o.layer_split, v)))
                continue;
              Structure s;
              s.global_batch = batch;
              s.micro_batches = m;
              s.schedule = sched;
              s.virtual_chunks = v;
              s.split_unit = split_divides(layers, o.layer_split, v) ? v : 1;
              // A stage's leading dense blocks (DeepSeek-style MoE) are counted from where its first
              // chunk starts in the first round, which only equal chunks fix.
              if (s.split_unit != v && leading_dense > 0) continue;
              s.groups = shared_groups;
              s.all_orders = families && groups.size() > 1;
              s.orders = s.all_orders ? factorial(static_cast<int>(groups.size())) : 1;
              bounds.set(&s);
              s.price_per_second = price;
              s.index = static_cast<int>(out.size());
              out.push_back(std::move(s));
              if (out.size() > kMaxStructures)
                throw Error(fmt::format("the search space has more than {} candidate layouts", kMaxStructures),
                            {"", "device_order"},
                            "pin the device order (--device-order), tp or pp to narrow it");
            }
          }
        }
        size_t g = 0;
        while (g < pick.size() && ++pick[g] == shapes[order[g]].size()) pick[g++] = 0;
        if (g == pick.size()) break;
      }
    }
  }
  return out;
}

}  // namespace alloy
