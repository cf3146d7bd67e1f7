// Candidate layouts for the planner: which device types form the pipeline in which order,
// each type's (tp, stages, dp), and the batch, micro-batching and schedule around them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
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
  std::shared_ptr<const std::vector<TypeGroup>> groups;  // pipeline order, shared across variants
  double lower_bound_seconds = 0;  // no layer split of this structure is faster
  double bottleneck_bound_seconds = 0;  // no split has a slowest stage faster (per micro-batch)
  double price_per_second = 0;     // of the devices it uses
  int index = 0;                   // enumeration order, for deterministic ties
  bool all_orders = false;         // a family: stands for every pipeline order of its groups
  int orders = 1;                  // pipeline orders it stands for

  int num_stages() const;
  int64_t micro_batch_sequences() const { return global_batch / micro_batches; }
};

// Device ids per type, ascending (node-major), and the tp quantum (gcd of devices per node).
struct TypePool {
  int device_type = 0;
  std::vector<int> device_ids;
  int devices_per_node = 1;
};
std::vector<TypePool> type_pools(const ClusterSpec& cluster);

// Lower bounds of structures from per-layer times, cached by (type, tp, per-replica batch).
class StructureBounds {
 public:
  StructureBounds(const CostModel& cost, const SearchOptions& options);
  // Sets the structure's bounds: for its pipeline order, or, for a family, for any order.
  void set(Structure* s);

 private:
  LayerSecondsBound layer_time(int type, int tp, int64_t per_replica_batch);

  const CostModel& cost_;
  const SearchOptions& options_;
  std::unordered_map<int64_t, LayerSecondsBound> layer_seconds_;
  std::vector<StageRate> rates_;
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
