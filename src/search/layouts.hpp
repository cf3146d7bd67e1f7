// Candidate layouts for the planner: which device types form the pipeline in which order,
// each type's (tp, stages, dp), and the batch, micro-batching and schedule around them.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cost/cost_model.hpp"
#include "search/planner.hpp"
#include "search/split_bound.hpp"

namespace alloy {

// One device type's share of the pipeline: `stages` consecutive stages, each tp x dp devices.
struct TypeGroup {
  int device_type = 0;
  int tp = 1;
  int stages = 1;
  int dp = 1;
};

// Whether the runtime runs sequence parallelism on a group's stages with micro-batches of
// `micro_batch` sequences of `seq_len` tokens (each replica's tokens must split over tp).
bool group_sequence_parallel_runnable(const TypeGroup& group, int64_t micro_batch, int64_t seq_len);

struct Structure {
  int64_t global_batch = 0;
  int micro_batches = 1;
  Schedule schedule = Schedule::Schedule_1f1b;
  int virtual_chunks = 1;
  // Blocks per unit of the layer split: v where every stage's chunks can be equal (the layers,
  // and a pinned split, divide by v), else 1 with at least v blocks per stage, its chunks sized
  // by chunk_blocks.
  int split_unit = 1;
  std::shared_ptr<const std::vector<TypeGroup>> groups;  // pipeline order, shared across variants
  double lower_bound_seconds = 0;  // no layer split of this structure is faster
  double bottleneck_bound_seconds = 0;  // no split has a slowest stage faster: (m - 1/v) x its time
                                        // per micro-batch plus its per-step overhead
  double price_per_second = 0;     // of the devices it uses
  int index = 0;                   // enumeration order, for deterministic ties
  bool all_orders = false;         // a family: stands for every pipeline order of its groups
  int orders = 1;                  // pipeline orders it stands for

  int num_stages() const;
  int64_t micro_batch_sequences() const { return global_batch / micro_batches; }
  // Least blocks per stage: one per chunk.
  int min_stage_blocks() const { return virtual_chunks; }
  // No stage's steady-state factor m - f (f: its first chunk's share of its blocks) is below
  // this: m - 1/v where chunks are equal, m - 2/(v + 1) otherwise (f is largest at v + 1 blocks).
  double min_steady_factor() const;
};

// Device ids per type, ascending (node-major), and the tp quantum (gcd of devices per node).
struct TypePool {
  int device_type = 0;
  std::vector<int> device_ids;
  int devices_per_node = 1;
};
std::vector<TypePool> type_pools(const ClusterSpec& cluster);

// A stage's gradient sync bound per unit of `unit` blocks.
OverheadRate sync_overhead_per_unit(const GradientSyncBound& sync, int unit);

// Lower bounds of structures from per-layer times and the gradient sync every stage pays,
// cached by (type, tp, per-replica batch) and (type, tp, dp, per-replica batch).
class StructureBounds {
 public:
  StructureBounds(const CostModel& cost, const SearchOptions& options, const std::vector<TypePool>& pools);
  // Sets the structure's bounds: for its pipeline order, or, for a family, for any order.
  void set(Structure* s);

 private:
  // Sequence-parallel settings a type group's stages may take: 1 plain, 2 sequence parallel.
  int sequence_parallel_mask(int tp) const;
  LayerSecondsBound layer_time(int type, int tp, int64_t per_replica_batch);
  // The least gradient sync of any stage of a type group (whichever of the group's placements
  // it has), by whether it holds the embedding (index bit 0) and the head (bit 1).
  using GroupSync = std::array<GradientSyncBound, 4>;
  const GroupSync& group_sync(const TypeGroup& g, int64_t per_replica_batch);
  // The group's i-th stage's devices in its type's pool.
  std::vector<int> stage_devices(const TypeGroup& g, int i) const;
  // One send of a micro-batch's hidden state (`bytes`) from `from`'s last stage to `to`'s first,
  // as every tp rank of the receiving side takes it whole, or as tp shards where the runtime
  // sends them (boundary_transfer_seconds).
  double group_send_seconds(const TypeGroup& from, const TypeGroup& to, double bytes);
  bool sends_sequence_shards(const TypeGroup& group) const;
  // One send of a micro-batch's hidden state from each stage of a group but its last to the
  // next stage of the group: the least of them and their sum (0 and 0 for one stage), for
  // micro-batches of `micro` sequences (`bytes` their hidden state).
  struct InnerSends {
    double least_seconds = 0;
    double total_seconds = 0;
  };
  const InnerSends& group_inner_sends(const TypeGroup& g, int64_t micro, double bytes);
  // Appends a type group's stages: each takes `unit_seconds` per unit of blocks, the pipeline's
  // first stage also the embedding, its last the head, each stage but the group's last at
  // least `inner_seconds` (its sends within the group), the group's last `sends_seconds` (to
  // the next group); their overheads, per unit of `unit` blocks.
  void rates_append(const TypeGroup& g, double unit_seconds, const LayerSecondsBound& t, const GroupSync& sync, int unit,
                    bool first_group, bool last_group, double inner_seconds, double sends_seconds);
  // The same for a family's group, whose place in the pipeline is open: no embedding, head or
  // sends to another group, the least gradient sync (as if it held both).
  void family_rates_append(const TypeGroup& g, double unit_seconds, const GroupSync& sync, int unit,
                           double inner_seconds);

  const CostModel& cost_;
  const SearchOptions& options_;
  const std::vector<TypePool>& pools_;
  std::unordered_map<int64_t, LayerSecondsBound> layer_seconds_;
  std::unordered_map<int64_t, GradientReduceBound> group_reduce_;  // by (type, tp, dp)
  std::unordered_map<int64_t, GroupSync> group_sync_;               // by (type, tp, dp, per-replica batch)
  std::map<std::pair<int64_t, int64_t>, BoundaryLink> group_links_;  // by the two groups' (type, tp, dp)
  std::unordered_map<int64_t, std::vector<BoundaryLink>> inner_links_;  // by (type, tp, dp): stage i to i + 1
  std::unordered_map<int64_t, InnerSends> inner_sends_;                 // by (type, tp, dp, micro-batch)
  std::vector<StageRate> rates_;
  std::vector<OverheadRate> overheads_;  // of the same stages
};

// Every structure the options allow, with lower bounds; without a pinned device order, the
// structures of several device types are families over their orders. Throws alloy::Error when
// the pins leave nothing (batch not divisible as pinned, tp that no node allows, ...).
std::vector<Structure> structures_enumerate(const CostModel& cost, const std::vector<TypePool>& pools,
                                            const SearchOptions& options, StructureBounds& bounds);

// Every pipeline order of a family's groups, each a structure with its own bounds (index unset).
std::vector<Structure> structure_orders(const Structure& family, StructureBounds& bounds);

// "a100-80gb-sxm tp2 dp2 x2 | v100-32gb tp1 dp4 x1": the layout without batching.
std::string structure_layout_key(const Structure& s, const ClusterSpec& cluster);

}  // namespace alloy
