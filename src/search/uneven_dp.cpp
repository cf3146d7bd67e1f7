#include "search/uneven_dp.hpp"
#include "search/expert_placement.hpp"
#include "search/zero_settings.hpp"

#include <algorithm>
#include <functional>
#include <set>

namespace alloy {

namespace {

// Every device holds the whole model: beyond this many, memory rules the kind out for any model
// worth a cluster that size, and dealing the batch sequence by sequence would cost the search
// more than it could win.
constexpr int kMaxReplicas = 64;

bool options_allow(const CostModel& cost, const SearchOptions& o) {
  const ClusterSpec& cluster = cost.cluster();
  std::set<int> types;
  for (const Device& d : cluster.devices) types.insert(d.device_type_index);
  const int devices = static_cast<int>(cluster.devices.size());
  if (!o.allow_uneven_dp || types.size() < 2 || devices > kMaxReplicas) return false;
  if (o.pp > 1 || o.tp > 1 || (o.dp > 0 && o.dp != devices) || o.layer_split.size() > 1 || !o.device_order.empty())
    return false;
  if (o.schedule == Schedule::Schedule_interleaved || o.virtual_chunks > 1) return false;
  if (o.sequence_parallel.value_or(false) || o.offload_activations > 0) return false;
  return true;
}

// Micro-batch sizes to try: divisors of the batch with at least one sequence per replica.
std::vector<int64_t> micro_batch_sizes(int64_t batch, int replicas, const SearchOptions& o) {
  std::vector<int64_t> sizes;
  for (int64_t b = replicas; b <= batch; ++b) {
    if (batch % b != 0) continue;
    if (o.micro_batch_sequences > 0 && b != o.micro_batch_sequences) continue;
    if (o.num_micro_batches > 0 && batch / b != o.num_micro_batches) continue;
    sizes.push_back(b);
  }
  return sizes;
}

// Forward plus backward seconds of one micro-batch of b sequences (1 to the batch) through the
// whole model on one device of `type` (tp 1), cached.
class ReplicaSeconds {
 public:
  ReplicaSeconds(const CostModel& cost, const std::vector<int>& device_ids)
      : cost_(cost), ids_(device_ids),
        cache_(cost.cluster().device_types.size(),
               std::vector<double>(static_cast<size_t>(cost.train().global_batch_sequences) + 1, -1.0)) {}
  double operator()(int type, int64_t b) {
    double& cached = cache_[static_cast<size_t>(type)][static_cast<size_t>(b)];
    if (cached >= 0) return cached;
    StageShape shape = cost_.stage_shape(ids_, 1, static_cast<int>(ids_.size()), b);
    shape.device_type = type;
    const StageUnitCosts u = cost_.unit_costs(shape, false);
    StageChoice every_block;
    every_block.blocks = static_cast<int>(cost_.model().num_layers);
    every_block.dense_blocks = model_is_moe(cost_.model()) ? static_cast<int>(cost_.model().moe.first_dense_layers) : 0;
    cached = stage_blocks_sum(every_block, u.block.forward_seconds + u.block.backward_seconds,
                              u.dense_block.times.forward_seconds + u.dense_block.times.backward_seconds) +
             u.embedding.forward_seconds + u.embedding.backward_seconds + u.head.forward_seconds +
             u.head.backward_seconds;
    return cached;
  }

 private:
  const CostModel& cost_;
  const std::vector<int>& ids_;
  std::vector<std::vector<double>> cache_;  // [type][sequences]; -1: not computed
};

// The ZeRO stages to try, under ZeRO 2-3 with both gradient strategies: accumulated in full
// first, so that sharding is kept only where it scores better (where its memory saves
// recomputation), not on a tie (one micro-batch), where it may hold more (a bucket beside the
// shard).
std::vector<ZeroSetting> uneven_zero_settings(const SearchOptions& o) {
  std::vector<ZeroSetting> out;
  for (int zero : {0, 1, 2, 3}) {
    if (o.zero >= 0 && zero != o.zero) continue;
    if (zero < 2) {
      out.push_back({zero, false});
      continue;
    }
    if (!o.shard_gradients.value_or(false)) out.push_back({zero, false});
    if (o.shard_gradients.value_or(true)) out.push_back({zero, true});
  }
  return out;
}

// One stage over every device with the given shares, evaluated; `full` blocks fully recomputed,
// the rest at `rest`; `piece`: per replica, the most sequences of one pass (empty: the whole
// share in one).
Plan uneven_plan(const CostModel& cost, const SearchOptions& o, const std::vector<int>& ids,
                 const std::vector<int64_t>& shares, int64_t micro_batch, const ZeroSetting& zero, int full,
                 Recompute rest, const std::vector<int64_t>& piece = {}) {
  const ClusterSpec& cluster = cost.cluster();
  const int layers = static_cast<int>(cost.model().num_layers);
  Plan plan;
  plan_set_identity(&plan, cost, o.objective);
  plan.global_batch_sequences = cost.train().global_batch_sequences;
  plan.micro_batch_sequences = micro_batch;
  plan.num_micro_batches = static_cast<int>(plan.global_batch_sequences / micro_batch);
  plan.schedule = o.schedule.value_or(Schedule::Schedule_1f1b);
  PlanStage st;
  st.device_ids = ids;
  st.dp = static_cast<int>(ids.size());
  st.zero = zero.zero;
  st.shard_gradients = zero.shard;
  st.chunks = {{0, layers}};
  st.has_embedding = st.has_head = true;
  for (int b = 0; b < layers; ++b) {
    st.recompute.push_back(b < full ? Recompute::Recompute_full : rest);
    st.offload.push_back(false);
  }
  for (size_t r = 0; r < ids.size(); ++r) {
    PlanReplica replica;
    replica.device_type = cluster.device_type(cluster.devices[ids[r]]).name;
    replica.sequences = shares[r];
    if (!piece.empty()) replica.pieces = static_cast<int>((shares[r] + piece[r] - 1) / piece[r]);
    st.replicas.push_back(std::move(replica));
  }
  st.device_type = st.replicas.front().device_type;
  plan.stages.push_back(std::move(st));
  plan_evaluate(&plan, cost);
  expert_placement_choose(cost, o, &plan);
  return plan;
}

double score(const Plan& plan, Objective objective) {
  return objective == Objective::Objective_cost ? plan.price_per_million_tokens
                                                : 1.0 / plan.tokens_per_second;
}

// Per replica: seconds of b sequences in one pass on its device.
std::vector<std::function<double(int64_t)>> whole_share_seconds(ReplicaSeconds& seconds, const ClusterSpec& cluster,
                                                                const std::vector<int>& ids) {
  std::vector<std::function<double(int64_t)>> out;
  for (int id : ids) {
    const int type = cluster.devices[id].device_type_index;
    out.push_back([&seconds, type](int64_t b) { return seconds(type, b); });
  }
  return out;
}

// Seconds of b sequences in passes of at most `piece` on a device of `type`.
double seconds_in_pieces(ReplicaSeconds& seconds, int type, int64_t piece, int64_t b) {
  return static_cast<double>(b / piece) * seconds(type, piece) + (b % piece > 0 ? seconds(type, b % piece) : 0.0);
}

// The pass size a device runs fastest per sequence: powers of two up to the batch.
int64_t fastest_piece(ReplicaSeconds& seconds, int type, int64_t batch) {
  int64_t best = 1;
  for (int64_t piece = 2; piece <= batch; piece *= 2)
    if (seconds(type, piece) / piece < seconds(type, best) / best) best = piece;
  return best;
}

// One micro-batch of the whole batch, each replica running its share in passes of its device's
// fastest size; a replica over its memory halves its pass size until it fits. Shares balanced
// by those passes' times. None when a replica does not fit even one sequence at a time.
// Gradients accumulate in full over the pieces (sharding them needs one pass per micro-batch).
std::optional<Plan> plan_in_pieces(const CostModel& cost, const SearchOptions& o, const std::vector<int>& ids,
                                   ReplicaSeconds& seconds, int zero, Recompute rest) {
  const ClusterSpec& cluster = cost.cluster();
  const int64_t batch = cost.train().global_batch_sequences;
  std::vector<int64_t> piece(ids.size());
  for (size_t r = 0; r < ids.size(); ++r) piece[r] = fastest_piece(seconds, cluster.devices[ids[r]].device_type_index, batch);
  for (;;) {
    std::vector<std::function<double(int64_t)>> in_pieces;
    for (size_t r = 0; r < ids.size(); ++r) {
      const int type = cluster.devices[ids[r]].device_type_index;
      const int64_t size = piece[r];
      in_pieces.push_back([&seconds, type, size](int64_t b) { return seconds_in_pieces(seconds, type, size, b); });
    }
    const std::vector<int64_t> shares = uneven_shares(batch, in_pieces);
    Plan plan = uneven_plan(cost, o, ids, shares, batch, {zero, false}, 0, rest, piece);
    bool over = false;
    for (size_t r = 0; r < ids.size(); ++r) {
      const PlanReplica& replica = plan.stages[0].replicas[r];
      if (replica.memory_total_bytes() <= replica.memory_capacity_bytes) continue;
      if (piece[r] == 1) return std::nullopt;
      piece[r] /= 2;
      over = true;
    }
    if (!over) return plan;
  }
}

}  // namespace

std::vector<int64_t> uneven_shares(int64_t micro_batch, const std::vector<std::function<double(int64_t)>>& seconds) {
  std::vector<int64_t> shares(seconds.size(), 1);
  for (int64_t given = static_cast<int64_t>(seconds.size()); given < micro_batch; ++given) {
    size_t best = 0;
    double best_end = seconds[0](shares[0] + 1);
    for (size_t r = 1; r < seconds.size(); ++r) {
      const double end = seconds[r](shares[r] + 1);
      if (end < best_end) {
        best_end = end;
        best = r;
      }
    }
    ++shares[best];
  }
  return shares;
}

std::optional<Plan> uneven_dp_best(const CostModel& cost, const SearchOptions& o) {
  if (!options_allow(cost, o)) return std::nullopt;
  const ClusterSpec& cluster = cost.cluster();
  std::vector<int> ids;
  for (const Device& d : cluster.devices) ids.push_back(d.id);
  const int layers = static_cast<int>(cost.model().num_layers);
  ReplicaSeconds replica_seconds(cost, ids);
  // Fully recomputed blocks come first, the others at `rest`; pinned recomputation fixes both.
  std::vector<Recompute> rests = {Recompute::Recompute_none, Recompute::Recompute_selective};
  int min_full = 0, max_full = layers;
  if (o.recompute == Recompute::Recompute_full) {
    rests = {Recompute::Recompute_none};
    min_full = layers;
  } else if (o.recompute) {
    rests = {*o.recompute};
    max_full = 0;
  }
  std::optional<Plan> best;
  const auto keep = [&](Plan plan) {
    if (!best || score(plan, o.objective) < score(*best, o.objective)) best = std::move(plan);
  };
  // Whole shares per micro-batch (any ZeRO stage), the fewest fully recomputed blocks that fit.
  const int64_t batch = cost.train().global_batch_sequences;
  for (int64_t micro_batch : micro_batch_sizes(batch, static_cast<int>(ids.size()), o)) {
    const std::vector<int64_t> shares = uneven_shares(micro_batch, whole_share_seconds(replica_seconds, cluster, ids));
    for (const ZeroSetting& zero : uneven_zero_settings(o))
      for (Recompute rest : rests) {
        const auto fits = [&](int full) {
          return plan_memory_ratio(uneven_plan(cost, o, ids, shares, micro_batch, zero, full, rest)) <= 1;
        };
        if (!fits(max_full)) continue;
        int lo = min_full, hi = max_full;
        while (lo < hi) {
          const int mid = (lo + hi) / 2;
          if (fits(mid)) hi = mid;
          else lo = mid + 1;
        }
        keep(uneven_plan(cost, o, ids, shares, micro_batch, zero, hi, rest));
      }
  }
  // Shares in passes of each device's own size (ZeRO 0-2: a ZeRO-3 gather per pass would differ
  // between replicas), without full recomputation.
  const bool one_micro_batch = (o.micro_batch_sequences <= 0 || o.micro_batch_sequences == batch) &&
                               o.num_micro_batches <= 1 &&
                               o.schedule.value_or(Schedule::Schedule_1f1b) == Schedule::Schedule_1f1b;
  // Every replica takes at least one sequence of the one micro-batch.
  if (one_micro_batch && min_full == 0 && batch >= static_cast<int64_t>(ids.size()) && !o.shard_gradients.value_or(false))
    for (int zero : {0, 1, 2})
      for (Recompute rest : rests)
        if (o.zero < 0 || zero == o.zero)
          if (std::optional<Plan> plan = plan_in_pieces(cost, o, ids, replica_seconds, zero, rest)) keep(std::move(*plan));
  return best;
}

}  // namespace alloy
