// The planner: searches stage splits, parallel shapes, layer splits, recomputation and
// offload, micro-batching and schedules for the fastest (or cheapest) layout that fits.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cost/cost_model.hpp"
#include "plan/plan.hpp"

namespace alloy {

enum class Objective { Objective_throughput, Objective_cost };
const char* objective_name(Objective objective);
// Throws alloy::Error for an unknown name (field "objective").
Objective objective_from_name(const std::string& name);

// Choices the user fixes; everything left unset is searched. A fully pinned layout is simply
// evaluated.
struct SearchOptions {
  Objective objective = Objective::Objective_throughput;
  int tp = 0;                          // every stage's tp; 0: free
  int pp = 0;                          // number of stages; 0: free
  int dp = 0;                          // every stage's dp; 0: free
  int ep = 0;                          // MoE: every stage's expert-parallel degree; 0: free
  int64_t micro_batch_sequences = 0;   // one micro-batch across a stage's replicas; 0: free
  int num_micro_batches = 0;           // 0: free
  std::optional<Schedule> schedule;
  int virtual_chunks = 0;              // interleaved only; 0: try 2 and 4
  int zero = -1;                       // -1: free
  std::optional<bool> shard_gradients;  // ZeRO 2-3 with dp > 1: shard (true) or accumulate in full
  std::optional<Recompute> recompute;  // one level for every block
  std::optional<bool> sequence_parallel;
  bool allow_offload = true;
  int prefetch_depth = 0;              // offloaded blocks fetched ahead (1-8); 0: free (1, 2 or 4)
  int offload_activations = 0;         // blocks per stage whose saved activations wait in host memory
  std::vector<int> layer_split;        // blocks per stage, pipeline order
  std::vector<std::string> device_order;  // device type names in pipeline order (only these used)
  bool every_device = false;           // only layouts that use every device of the cluster
  bool allow_uneven_dp = true;         // also one stage over devices of several types, each replica
                                       // taking the share of every micro-batch its speed earns
  int threads = 1;                     // 1 or 2; the plan does not depend on it
  int runner_ups = 3;
};

struct SearchStats {
  int64_t structures = 0;            // (batch, stage layout, micro-batching, schedule) candidates
  int64_t pruned_by_bound = 0;       // never evaluated: lower bound no better than the kept plans
  int64_t pruned_by_refined_bound = 0;  // bound from the placed stages (boundary sends, head)
  int64_t evaluated = 0;
  int64_t infeasible = 0;            // evaluated, nothing fits in memory
  int64_t split_solves = 0;          // layer-split dynamic programs run
  int64_t stage_option_sets = 0;     // (stage, layer count) option sets computed
  double seconds = 0;
};

struct SearchResult {
  Plan plan;
  SearchStats stats;
  std::vector<Plan> candidates;  // the chosen plan and its runner-ups as full plans, best first
};

// Throws alloy::Error when nothing fits (with the device or host memory needed and what would
// help), when the
// batch cannot be divided as pinned, when the cluster has no devices or pins contradict it.
SearchResult plan_search(const CostModel& cost, const SearchOptions& options);

// Fills a plan's identity fields from the specs (names, fingerprints, sizes).
void plan_set_identity(Plan* plan, const CostModel& cost, Objective objective);
// Fills every prediction of a plan (per stage and whole) from the cost model. The plan must
// pass plan_validate_for.
void plan_evaluate(Plan* plan, const CostModel& cost);
// Mixture-of-Experts: sets the expert fields of `shape` (stage `s`, replica `dp_rank`) from the
// plan's ep and expert placement; nothing for a dense model.
void plan_stage_set_experts(const CostModel& cost, const Plan& plan, int s, int dp_rank, StageShape* shape);
// Largest memory use over capacity among the plan's stages (after plan_evaluate); <= 1 fits.
double plan_memory_ratio(const Plan& plan);

}  // namespace alloy
