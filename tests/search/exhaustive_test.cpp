// Issue 3, "done when" 1: on random small problems (<= 8 devices of <= 2 types, <= 8 layers,
// every dimension enabled), an exhaustive search written here agrees with the planner.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <cstdio>
#include <random>
#include <set>

#include "../support/specs.hpp"
#include "cost/network_paths.hpp"
#include "plan/runnable.hpp"
#include "search/planner.hpp"
#include "search/zero_settings.hpp"
#include "search/stage_options.hpp"
#include "spec/error.hpp"

namespace alloy {
namespace {

using testing::GroupSpec;

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Point {
  double t;
  double u;
};

// Brute force over: ordered subsets of device types; per type every (tp | devices per node,
// stages, dp) using all its devices; every micro-batch count; GPipe, 1F1B and interleaved
// (v = 2, 4); every contiguous layer split; per stage every ZeRO stage, sequence parallelism,
// every number of selective and full-recompute blocks, every offload count of the space
// (stage_offload_counts: exact up to 4 blocks, then coarse buckets) that host memory holds where
// the runtime offloads with that gradient strategy, and prefetch depths 1, 2 and 4.
class Exhaustive {
 public:
  // `offload`: also offload blocks' weights to host memory (the planner's allow_offload).
  explicit Exhaustive(const CostModel& cost, bool offload = true) : cost_(cost), offload_(offload) {}
  // Only the interleaved schedule, as SearchOptions::schedule pins it.
  void interleaved_only() { schedules_ = {Schedule::Schedule_interleaved}; }

  double best() {
    const ClusterSpec& c = cost_.cluster();
    std::vector<int> types;
    for (size_t t = 0; t < c.device_types.size(); ++t) types.push_back(static_cast<int>(t));
    double best = kInf;
    for (int mask = 1; mask < (1 << types.size()); ++mask) {
      std::vector<int> chosen;
      for (size_t i = 0; i < types.size(); ++i)
        if (mask & (1 << i)) chosen.push_back(types[i]);
      do best = std::min(best, over_shapes(chosen, 0, {}));
      while (std::next_permutation(chosen.begin(), chosen.end()));
    }
    return best;
  }

 private:
  struct Group {
    int type, tp, stages, dp;
  };

  // The runtime offloads blocks' weights with this gradient strategy (plan/runnable.hpp).
  static bool offload_runs(const Group& g, bool shard) {
    StageLayout layout;
    layout.tp = g.tp;
    layout.dp = g.dp;
    layout.offload = true;
    layout.shard_gradients = shard;
    return stage_features_runnable(layout).ok;
  }

  std::vector<int> ids_of(int type) const {
    std::vector<int> ids;
    for (const Device& d : cost_.cluster().devices)
      if (d.device_type_index == type) ids.push_back(d.id);
    return ids;
  }

  int per_node(int type) const {
    int q = 0;
    for (const NodeGroup& g : cost_.cluster().node_groups)
      if (g.device_type_index == type) q = q == 0 ? g.devices_per_node : std::min(q, g.devices_per_node);
    return q;
  }

  double over_shapes(const std::vector<int>& order, size_t at, std::vector<Group> groups) {
    if (at == order.size()) return over_batching(groups);
    const int type = order[at];
    const int n = static_cast<int>(ids_of(type).size());
    double best = kInf;
    for (int tp = 1; tp <= per_node(type); tp *= 2) {
      // Only what the runtime runs, as the planner: tp dividing the heads, kv heads and FFN.
      if (per_node(type) % tp != 0 || n % tp != 0 || !tp_runnable(cost_.model(), tp).ok) continue;
      for (int k = 1; k <= n / tp; ++k) {
        if ((n / tp) % k != 0) continue;
        groups.push_back({type, tp, k, n / tp / k});
        best = std::min(best, over_shapes(order, at + 1, groups));
        groups.pop_back();
      }
    }
    return best;
  }

  double over_batching(const std::vector<Group>& groups) {
    const int layers = static_cast<int>(cost_.model().num_layers);
    const int64_t batch = cost_.train().global_batch_sequences;
    int p = 0;
    for (const Group& g : groups) p += g.stages;
    if (p > layers) return kInf;
    double best = kInf;
    for (int m = 1; m <= batch; ++m) {
      if (batch % m != 0) continue;
      bool divides = true;
      for (const Group& g : groups) divides = divides && (batch / m) % g.dp == 0;
      if (!divides) continue;
      for (Schedule sched : schedules_) {
        for (int v : sched == Schedule::Schedule_interleaved ? std::vector<int>{2, 4} : std::vector<int>{1}) {
          if (v > 1 && (p < 2 || p * v > layers || m % p != 0)) continue;
          best = std::min(best, over_splits(groups, p, m, sched, v));
        }
      }
    }
    return best;
  }

  double over_splits(const std::vector<Group>& groups, int p, int m, Schedule sched, int v) {
    const int64_t micro = cost_.train().global_batch_sequences / m;
    // Stage devices: consecutive slices of each type's ids.
    std::vector<std::vector<int>> stage_ids;
    std::vector<const Group*> stage_group;
    for (const Group& g : groups) {
      const std::vector<int> ids = ids_of(g.type);
      for (int j = 0; j < g.stages; ++j) {
        stage_ids.emplace_back(ids.begin() + j * g.tp * g.dp, ids.begin() + (j + 1) * g.tp * g.dp);
        stage_group.push_back(&g);
      }
    }
    // Every split with at least v blocks per stage (in units of v where the layers divide by it).
    const int layers = static_cast<int>(cost_.model().num_layers);
    const int unit = layers % v == 0 ? v : 1;
    const int units = layers / unit;
    const int fewest = v / unit;
    std::vector<int> split(p, 1);
    double best = kInf;
    std::function<void(int, int)> rec = [&](int s, int left) {
      if (s == p - 1) {
        split[s] = left;
        std::vector<std::vector<Point>> fronts(p);
        for (int i = 0; i < p; ++i) {
          fronts[i] = stage_front(stage_ids, *stage_group[i], stage_group[(i + 1) % p]->tp, i, p, m, sched, v, micro,
                                  split[i] * unit);
          if (fronts[i].empty()) return;
        }
        // A table tied between the first and last stage is summed between them every step.
        const double tied = network_tied_table_seconds(
            cost_.cluster(), cost_.model(), static_cast<int>(cost_.gradient_wire_bytes(0)), stage_ids.front(),
            stage_group.front()->tp, stage_ids[p - 1], stage_group[p - 1]->tp);
        std::vector<double> t(p), u(p), fill(p);
        for (int i = 0; i < p; ++i) fill[i] = stage_fill_fraction(split[i] * unit, v);
        std::function<void(int)> combine = [&](int i) {
          if (i == p) {
            std::vector<double> with_tied = u;
            if (p > 1) {
              with_tied.front() += tied;
              with_tied.back() += tied;
            }
            best = std::min(best, pipeline_step_seconds(t, fill, with_tied, m));
            return;
          }
          for (const Point& pt : fronts[i]) {
            t[i] = pt.t;
            u[i] = pt.u;
            combine(i + 1);
          }
        };
        combine(0);
        return;
      }
      for (int k = fewest; k <= left - (p - 1 - s) * fewest; ++k) {
        split[s] = k;
        rec(s + 1, left - k);
      }
    };
    rec(0, units);
    return best;
  }

  std::vector<Point> stage_front(const std::vector<std::vector<int>>& stage_ids, const Group& g, int next_tp, int s, int p, int m,
                                 Schedule sched, int v, int64_t micro, int blocks) {
    const StageShape shape = cost_.stage_shape(stage_ids[s], g.tp, g.dp, micro / g.dp);
    const int next = (s + 1) % p;
    double send = 0;
    int chunks_sent = 0;
    std::vector<Point> all;
    for (int sp = 0; sp <= (g.tp > 1 ? 1 : 0); ++sp) {
      const StageUnitCosts unit = cost_.unit_costs(shape, sp == 1);
      if (next != s && (s + 1 < p || v > 1)) {
        send = boundary_transfer_seconds(unit.boundary_bytes, cost_.boundary_link(stage_ids[s], stage_ids[next]), g.tp,
                                         next_tp);
        chunks_sent = s + 1 < p ? v : v - 1;
      }
      const double in_flight = schedule_micro_batches_in_flight(sched, p, s, m, stage_chunk_blocks(blocks, v));
      for (int zero = 0; zero <= 3; ++zero)
        for (int shard = 0; shard <= (zero >= 2 && g.dp > 1 ? 1 : 0); ++shard)
        for (int full = 0; full <= blocks; ++full)
          for (int sel = 0; sel + full <= blocks; ++sel)
            for (int off : stage_offload_counts(offload_ ? blocks : 0))
              for (int depth : {1, 2, 4}) {
                if (off == 0 && depth > 1) continue;  // the depth of nothing offloaded changes nothing
                if (off > 0 && !offload_runs(g, shard == 1)) continue;
                // The planner's preference: accumulating in full that saves at most
                // kShardingTimeTolerance of the compute over sharding, which holds less, is set
                // aside but where it offloads and sharding cannot.
                if (shard == 0 && zero >= 2 && g.dp > 1 && (off == 0 || offload_runs(g, true)) &&
                    sharding_preferred(shape, unit, zero, m, blocks, in_flight, s, p))
                  continue;
                StageChoice c;
                c.blocks = blocks;
                c.selective = sel;
                c.full = full;
                c.offloaded = off;
                c.prefetch_depth = depth;
                c.micro_batches = m;
                c.zero = zero;
                c.shard_gradients = shard == 1;
                c.has_embedding = s == 0;
                c.has_head = s == p - 1;
                c.head_holds_lm_matrix = !(cost_.model().tied_embeddings && p == 1);
                // Each chunk's input and output between stages is held with its activations.
                c.chunks_sent = chunks_sent;
                c.chunks_received = p > 1 ? (s > 0 ? v : v - 1) : 0;
                c.virtual_chunks = v;
                const MemoryBreakdown mem = cost_.stage_memory(shape, unit, c, in_flight, p > 1);
                if (mem.total_bytes() > cost_.device_memory_bytes(shape.device_type)) continue;
                if (mem.host_offload_bytes > cost_.host_memory_share_bytes(shape.device_type)) continue;
                const StageTiming timing = cost_.stage_timing(shape, unit, c, send, chunks_sent);
                all.push_back({timing.per_micro_batch_seconds(), timing.step_overhead_seconds()});
              }
    }
    std::sort(all.begin(), all.end(), [](const Point& a, const Point& b) { return a.t != b.t ? a.t < b.t : a.u < b.u; });
    std::vector<Point> front;
    for (const Point& pt : all)
      if (front.empty() || pt.u < front.back().u) front.push_back(pt);
    return front;
  }

  // Whether sharding at `zero` costs at most kShardingTimeTolerance of the stage's plain compute
  // more sync than accumulating in full and holds less memory (both without recomputation or
  // offload), as the planner weighs them (search/zero_settings.cpp).
  bool sharding_preferred(const StageShape& shape, const StageUnitCosts& unit, int zero, int m, int blocks,
                          double in_flight, int s, int p) const {
    StageChoice c;
    c.blocks = blocks;
    c.micro_batches = m;
    c.zero = zero;
    c.has_embedding = s == 0;
    c.has_head = s == p - 1;
    c.head_holds_lm_matrix = !(cost_.model().tied_embeddings && p == 1);
    StageChoice sharded = c;
    sharded.shard_gradients = true;
    const double compute = m * blocks * (unit.block.forward_seconds + unit.block.backward_seconds);
    const double extra = cost_.stage_gradient_sync_seconds(shape, unit, sharded) - cost_.stage_gradient_sync_seconds(shape, unit, c);
    return extra <= kShardingTimeTolerance * compute &&
           cost_.stage_memory(shape, unit, sharded, in_flight, p > 1).total_bytes() <
               cost_.stage_memory(shape, unit, c, in_flight, p > 1).total_bytes();
  }

  const CostModel& cost_;
  bool offload_ = true;
  std::vector<Schedule> schedules_ = {Schedule::Schedule_gpipe, Schedule::Schedule_1f1b, Schedule::Schedule_interleaved};
};

struct Problem {
  ModelSpec model;
  ClusterSpec cluster;
  TrainSpec train;
};

Problem random_problem(std::mt19937& rng, const std::vector<int>& layer_counts = {2, 3, 4, 4, 6, 8}) {
  auto pick = [&](std::vector<int> values) { return values[std::uniform_int_distribution<size_t>(0, values.size() - 1)(rng)]; };
  Problem pr;
  const int hidden = pick({256, 512, 1024});
  const int heads = pick({4, 8});
  const bool is_llama = pick({0, 1}) == 1;
  const int layers = pick(layer_counts);
  if (is_llama) pr.model = testing::llama("toy-llama", layers, hidden, heads, heads / pick({1, 2}), hidden * 3, pick({512, 2048}));
  else pr.model = testing::gpt2("toy-gpt", layers, hidden, heads, pick({512, 2048}), 1024);
  pr.train = testing::train(pick({256, 512, 1024}), pick({4, 8, 16, 32}));

  // Memory: the GPU context plus a budget from tight (needs recompute, offload, ZeRO) to ample.
  auto shrink = [&](DeviceType t) {
    t.memory_bytes = 1024.0 * 1024 * 1024 + std::uniform_real_distribution<double>(40, 800)(rng) * 1024 * 1024;
    return t;
  };
  const int two_types = pick({0, 1, 1});
  std::vector<DeviceType> types = {shrink(testing::a100_80())};
  std::vector<GroupSpec> groups;
  if (two_types) {
    types.push_back(shrink(pick({0, 1}) ? testing::v100_32() : testing::mi250x()));
    const int per_a = pick({1, 2, 4});
    const int per_b = pick({1, 2});
    groups.push_back({0, pick({1, 2}), per_a});
    groups.push_back({1, pick({1, 2}), per_b});
    while (groups[0].nodes * groups[0].per_node + groups[1].nodes * groups[1].per_node > 8) groups[0].nodes = 1, groups[0].per_node /= 2;
  } else {
    groups.push_back({0, pick({1, 2}), pick({1, 2, 4})});
  }
  pr.cluster = testing::cluster("toy", types, groups, pick({0, 1}) ? 25e9 : 3e9);
  return pr;
}

// A small cluster behind racks and two sites: every node a node group of its own (so a type's
// nodes may sit in different racks), racks oversubscribed up to 8:1 across a WAN of 1-10 Gb/s
// with 1-10 ms latency, some nodes behind a NIC 10x slower than the rest. Data-parallel
// reductions and stage boundaries that cross these links cost as much as the compute beside
// them, so the planner's bounds on what every layout must communicate decide what it prunes.
Problem random_tiered_problem(std::mt19937& rng) {
  auto pick = [&](std::vector<double> values) {
    return values[std::uniform_int_distribution<size_t>(0, values.size() - 1)(rng)];
  };
  Problem pr = random_problem(rng);
  std::vector<GroupSpec> nodes;
  for (const NodeGroup& g : pr.cluster.node_groups)
    for (int n = 0; n < g.count; ++n) nodes.push_back({g.device_type_index, 1, g.devices_per_node});
  ClusterSpec c = testing::cluster("toy-tiered", pr.cluster.device_types, nodes, pr.cluster.network.bandwidth_bytes_per_second);
  const int racks = std::min(static_cast<int>(pick({2, 3})), static_cast<int>(nodes.size()));
  if (racks >= 2) {
    c.sites = {Site{"east"}, Site{"west"}};
    c.wan = {"ethernet", pick({0.125e9, 1.25e9, 12.5e9}), pick({0.1e-3, 1e-3, 10e-3})};
  }
  for (int r = 0; r < racks; ++r) {
    Rack rack;
    rack.name = "r" + std::to_string(r);
    rack.site = racks >= 2 ? r % 2 : -1;
    rack.oversubscription = pick({1, 2, 4, 8});
    rack.latency_seconds = pick({0, 2e-6, 50e-6});
    c.racks.push_back(rack);
  }
  // Every rack holds a node: node i goes to rack i, the rest at random.
  for (size_t i = 0; i < c.node_groups.size(); ++i) {
    NodeGroup& g = c.node_groups[i];
    g.rack = static_cast<int>(i) < racks ? static_cast<int>(i) : static_cast<int>(pick({0, 1, 2})) % racks;
    g.site = c.racks[g.rack].site;
    if (pick({0, 0, 1}) == 1) g.network = {"ethernet", c.network.bandwidth_bytes_per_second / 10, 20e-6};
  }
  pr.cluster = c;
  return pr;
}

// The brute force enumerates layer splits over stages of one device type each; uneven data
// parallelism (one stage over several types) is outside it.
const SearchOptions kLayerSplitsOnly = [] {
  SearchOptions o;
  o.allow_uneven_dp = false;
  return o;
}();

TEST(Exhaustive, PlannerMatchesBruteForceOnRandomSmallProblems) {
  std::mt19937 rng(20241129);
  int feasible = 0;
  int with_recompute_or_offload = 0;
  int heterogeneous = 0;
  for (int trial = 0; trial < 32; ++trial) {
    Problem pr = random_problem(rng);
    CostModel cost(pr.model, pr.cluster, pr.train);
    const double brute = Exhaustive(cost).best();
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ": " << pr.model.name << " L" << pr.model.num_layers
                                      << " devices " << pr.cluster.devices.size() << " batch "
                                      << pr.train.global_batch_sequences);
    if (brute == kInf) {
      EXPECT_THROW(plan_search(cost, kLayerSplitsOnly), Error);
      continue;
    }
    ++feasible;
    const SearchResult r = plan_search(cost, kLayerSplitsOnly);
    EXPECT_NEAR(r.plan.step_seconds, brute, 1e-9 * brute);
    EXPECT_LE(plan_memory_ratio(r.plan), 1.0);
    plan_validate_for(r.plan, pr.model, pr.cluster);
    // Uneven data parallelism only adds candidates: never slower than the best layer split.
    const SearchResult free_search = plan_search(cost, {});
    EXPECT_LE(free_search.plan.step_seconds, brute * (1 + 1e-9));
    EXPECT_LE(plan_memory_ratio(free_search.plan), 1.0);
    plan_validate_for(free_search.plan, pr.model, pr.cluster);
    std::set<std::string> types;
    for (const PlanStage& s : r.plan.stages) {
      types.insert(s.device_type);
      for (size_t i = 0; i < s.recompute.size(); ++i)
        if (s.recompute[i] != Recompute::Recompute_none || s.offload[i]) {
          ++with_recompute_or_offload;
          break;
        }
    }
    heterogeneous += types.size() > 1;
  }
  std::printf("feasible %d, recompute or offload %d, heterogeneous %d\n", feasible, with_recompute_or_offload,
              heterogeneous);
  // The random problems must exercise the space, not only its easy corner.
  EXPECT_GE(feasible, 20);
  EXPECT_GE(with_recompute_or_offload, 3);
  EXPECT_GE(heterogeneous, 3);
}

// Devices whose memory is slower than the host's optimizer stream (20 GB/s): offloading a block
// lowers the per-step overhead, the case where the stage search may not stop at the first count
// that fits (overhead falls with the count while time grows).
// Layer counts that do not divide by the chunks: interleaved stages of unequal chunks, split in
// single layers with at least one per chunk, priced with their first chunk's share.
TEST(Exhaustive, PlannerMatchesBruteForceWithUnequalChunks) {
  std::mt19937 rng(20261203);
  int feasible = 0;
  int unequal = 0;
  for (int trial = 0; trial < 16; ++trial) {
    Problem pr = random_problem(rng, {5, 7, 9, 10});
    CostModel cost(pr.model, pr.cluster, pr.train);
    Exhaustive brute_force(cost);
    brute_force.interleaved_only();
    const double brute = brute_force.best();
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ": L" << pr.model.num_layers << " devices "
                                      << pr.cluster.devices.size() << " batch " << pr.train.global_batch_sequences);
    SearchOptions interleaved = kLayerSplitsOnly;
    interleaved.schedule = Schedule::Schedule_interleaved;
    if (brute == kInf) {
      EXPECT_THROW(plan_search(cost, interleaved), Error);
      continue;
    }
    ++feasible;
    const SearchResult r = plan_search(cost, interleaved);
    EXPECT_NEAR(r.plan.step_seconds, brute, 1e-9 * brute);
    plan_validate_for(r.plan, pr.model, pr.cluster);
    for (const PlanStage& st : r.plan.stages)
      if (st.chunks.front().size() != st.chunks.back().size()) {
        ++unequal;
        break;
      }
  }
  std::printf("feasible %d, best plan with unequal chunks %d\n", feasible, unequal);
  EXPECT_GE(feasible, 8);
  EXPECT_GE(unequal, 3);
}

TEST(Exhaustive, PlannerMatchesBruteForceWhenTheHostOptimizerIsFaster) {
  std::mt19937 rng(20261130);
  int offloaded = 0;
  for (int trial = 0; trial < 8; ++trial) {
    Problem pr = random_problem(rng);
    for (DeviceType& t : pr.cluster.device_types) t.memory_bandwidth_bytes_per_second = 10e9;
    CostModel cost(pr.model, pr.cluster, pr.train);
    const double brute = Exhaustive(cost).best();
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ": " << pr.model.name << " L" << pr.model.num_layers);
    if (brute == kInf) {
      EXPECT_THROW(plan_search(cost, kLayerSplitsOnly), Error);
      continue;
    }
    const SearchResult r = plan_search(cost, kLayerSplitsOnly);
    EXPECT_NEAR(r.plan.step_seconds, brute, 1e-9 * brute);
    for (const PlanStage& s : r.plan.stages) offloaded += static_cast<int>(std::count(s.offload.begin(), s.offload.end(), true));
  }
  EXPECT_GT(offloaded, 0);
}

// On racks, oversubscribed uplinks and a slow WAN the planner still finds the brute force's best:
// its bounds with communication every layout pays prune nothing that could win. Without offload:
// across a slow WAN, offloading a ZeRO-3 stage's blocks can be faster than gathering them,
// which the stage search does not look for (offload there only adds time).
TEST(Exhaustive, PlannerMatchesBruteForceOnTieredNetworks) {
  SearchOptions no_offload = kLayerSplitsOnly;
  no_offload.allow_offload = false;
  std::mt19937 rng(20260311);
  int feasible = 0;
  int dp_reduces = 0;
  int dp_across_nodes = 0;
  for (int trial = 0; trial < 96; ++trial) {
    Problem pr = random_tiered_problem(rng);
    CostModel cost(pr.model, pr.cluster, pr.train);
    const double brute = Exhaustive(cost, false).best();
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ": " << pr.model.name << " L" << pr.model.num_layers
                                      << " devices " << pr.cluster.devices.size() << " racks " << pr.cluster.racks.size());
    if (brute == kInf) {
      EXPECT_THROW(plan_search(cost, no_offload), Error);
      continue;
    }
    ++feasible;
    const SearchResult r = plan_search(cost, no_offload);
    EXPECT_NEAR(r.plan.step_seconds, brute, 1e-9 * brute);
    bool reduces = false, across = false;
    for (const PlanStage& s : r.plan.stages) {
      reduces = reduces || s.dp > 1;
      across = across || (s.dp > 1 && network_distinct_nodes(pr.cluster, s.device_ids) > 1);
    }
    dp_reduces += reduces;
    dp_across_nodes += across;
  }
  std::printf("feasible %d, data parallelism %d, across nodes %d\n", feasible, dp_reduces, dp_across_nodes);
  EXPECT_GE(feasible, 50);
  EXPECT_GE(dp_reduces, 25);
  EXPECT_GE(dp_across_nodes, 4);
}

}  // namespace
}  // namespace alloy
