// ZeRO 3 parameters: each data-parallel member keeps only its pieces of the stage's weights;
// the weights of a block (or of the embedding or head) are all-gathered into a temporary
// buffer and freed right after the pass that uses them. Acquiring a unit starts the gather of
// the next one in the pass's order (the next block forward, the previous one backward), so it
// runs during this unit's compute: two units are gathered at most. Blocks offloaded to host
// memory are not this class's: their weights stay whole there (updated a piece per member and
// gathered after the optimizer) and come through the offload engine. Under expert parallelism a
// block's routed experts lie apart from its other weights (after every other tensor) and are
// sharded over the expert-dp group: such a unit is two spans, each gathered over its bucket's group.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "runtime/parallel/communicator.hpp"
#include "runtime/parallel/param_layout.hpp"
#include "runtime/model.hpp"

namespace alloy {

class Zero3Parameters : public ParameterSource {
 public:
  // Takes the model's initialised weights in device memory: keeps this member's pieces of them
  // (layout.optimizer_ranges on the device, packed in order) and frees the device's parameters.
  // dp gathers the buckets' pieces, expert_dp the routed experts' (GradientBucket::experts).
  Zero3Parameters(Model& model, const ParamLayout& layout, Communicator& comm, const CommGroup& dp,
                  const CommGroup& expert_dp);
  ~Zero3Parameters() override;
  Zero3Parameters(const Zero3Parameters&) = delete;
  Zero3Parameters& operator=(const Zero3Parameters&) = delete;

  void acquire(int unit, bool backward) override;
  void release(int unit, bool backward) override;

  // This member's pieces of the device's parameters: (piece_floats()), what the optimizer updates.
  float* pieces() { return pieces_; }
  int64_t piece_floats() const { return piece_floats_; }
  const std::vector<FlatRange>& piece_ranges() const { return piece_ranges_; }  // ascending, packed in order
  // Where flat parameters [offset, offset + count) of this member's device pieces are in pieces().
  float* pieces_at(int64_t offset, int64_t count);
  // Drops gathered weights no pass holds (a prefetch not used yet): call before the pieces change.
  void drop_prefetched();
  // Every parameter of the rank's shard in model order (num_parameters), the offloaded blocks'
  // from host memory. Collective over dp.
  std::vector<float> full_parameters();
  double take_wait_seconds();

 private:
  // A run of a unit's views inside one bucket: its weights at buffer + at.
  struct Span {
    bool experts = false;  // routed experts of an expert-parallel shard (gathered over expert-dp)
    FlatRange range;
    int64_t at = 0;
    CommHandle gathering;  // the all-gather in flight, if any
  };
  struct Unit {
    std::vector<Span> spans;         // in flat order: the views, then (expert parallelism) the experts
    std::vector<size_t> views;       // indices into model.views
    int64_t floats = 0;              // the spans' total
    float* buffer = nullptr;         // gathered (or being gathered) weights
    bool in_flight = false;
    int holders = 0;
  };
  // Adds view k to its unit: extends the unit's span of the same kind (routed expert or not).
  void unit_add_view(Unit& unit, size_t k);
  void span_gather_start(Unit& unit, Span& span);
  // Where flat parameter `offset` of the unit is in its buffer.
  float* unit_at(const Unit& unit, int64_t offset) const;
  void gather_start(Unit& unit);
  // Gathers the unit if needed and, with `prefetch`, starts the next one in the pass's order.
  void acquire_unit(int unit, bool backward, bool prefetch);
  void gather_finish(Unit& unit);
  // The unit a pass uses after `id` on this rank's contiguous blocks, or nullptr.
  Unit* next_unit(int id, bool backward);
  void bind(const Unit& unit, bool bound);  // points the unit's weight slots into its buffer, or nowhere

  Model& model_;
  const ParamLayout& layout_;
  Communicator& comm_;
  CommGroup dp_;
  CommGroup expert_dp_;
  std::vector<float**> slots_;
  std::map<int, Unit> units_;         // the device's units
  std::set<int> offloaded_;           // blocks in host memory (the offload engine's)
  std::vector<FlatRange> piece_ranges_;  // this member's pieces on the device, ascending
  float* pieces_ = nullptr;
  int64_t piece_floats_ = 0;
  double wait_seconds_ = 0;
};

}  // namespace alloy
