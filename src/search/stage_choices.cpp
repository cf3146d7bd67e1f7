// A stage's choices as the cost model counts them (StageChoice from a slot and an option), the
// offload space the planner searches, and the most frugal choice of a stage, which infeasibility
// reports quote.
#include "search/stage_options.hpp"
#include "search/zero_settings.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace alloy {

std::vector<int> stage_prefetch_depths(const OptionPins& pins) {
  if (pins.prefetch_depth > 0) return {pins.prefetch_depth};
  if (!pins.allow_offload) return {1};
  return {1, 2, 4};
}

int stage_max_offloaded(const CostModel& cost, const StageSlot& slot, int blocks, const ZeroSetting& zero) {
  const StageUnitCosts* unit = slot.unit[0] ? slot.unit[0] : slot.unit[1];
  if (!unit || blocks <= 0 || !zero_setting_offloads(slot, zero)) return 0;  // plans keep to what the runtime runs
  StageOption option;
  option.zero = zero.zero;
  option.shard_gradients = zero.shard;
  const auto host_bytes = [&](int offloaded) {
    option.offloaded = offloaded;
    return cost.stage_memory(slot.shape, *unit, stage_choice_of(slot, option, blocks), slot.in_flight, slot.has_next)
        .host_offload_bytes;
  };
  // Host bytes are linear in the offloaded count of each kind of block: an MoE model's leading
  // dense blocks are offloaded first, then its MoE blocks.
  const double capacity = slot.host_capacity_bytes * (1 + 1e-12);
  const auto most_of = [&](int count, double per_block, double room) {
    return per_block <= 0 ? count : std::clamp(static_cast<int>(std::floor(room / per_block)), 0, count);
  };
  const int dense = stage_slot_dense_blocks(slot, blocks);
  const double dense_bytes = dense > 0 ? host_bytes(dense) : 0;
  if (dense > 0 && dense_bytes > capacity) return most_of(dense, dense_bytes / dense, capacity);
  if (dense == blocks) return blocks;
  return dense + most_of(blocks - dense, host_bytes(dense + 1) - dense_bytes, capacity - dense_bytes);
}

std::vector<int> stage_offload_counts(int blocks) {
  std::vector<int> counts;
  for (int c = 0; c < blocks; c = c < 4 ? c + 1 : c + c / 2) counts.push_back(c);
  counts.push_back(blocks);
  return counts;
}

StageSlot slot_with_blocks(const StageSlot& slot, int blocks) {
  StageSlot out = slot;
  if (blocks % slot.virtual_chunks != 0)
    out.in_flight = schedule_micro_batches_in_flight(Schedule::Schedule_interleaved, slot.pipeline_stages, slot.stage_index,
                                                     slot.micro_batches, stage_chunk_blocks(blocks, slot.virtual_chunks));
  return out;
}

StageChoice stage_choice_of(const StageSlot& slot, const StageOption& option, int blocks) {
  StageChoice c;
  c.blocks = blocks;
  c.selective = option.selective;
  c.full = option.full;
  c.offloaded = option.offloaded;
  c.prefetch_depth = option.prefetch_depth;
  // Parked blocks are the first ones not under full recomputation (which saves nothing to park).
  const int parked = std::min(option.parked, blocks - option.full);
  c.parked_selective = std::min(parked, option.selective);
  c.parked_none = parked - c.parked_selective;
  c.micro_batches = slot.micro_batches;
  c.zero = option.zero;
  c.shard_gradients = option.shard_gradients;
  c.has_embedding = slot.has_embedding;
  c.has_head = slot.has_head;
  c.head_holds_lm_matrix = slot.head_holds_lm_matrix;
  c.chunks_sent = slot.chunks_sent;
  c.chunks_received = slot.chunks_received;
  c.virtual_chunks = std::max(1, slot.virtual_chunks);
  stage_choice_set_dense_blocks(&c, stage_slot_dense_blocks(slot, blocks));
  return c;
}

int stage_slot_dense_blocks(const StageSlot& slot, int blocks) {
  const int v = std::max(1, slot.virtual_chunks);
  int dense = 0;
  for (int c = 0; c < v; ++c) {
    const int ahead = slot.leading_dense_blocks - c * slot.round_blocks;
    if (ahead <= 0) break;
    dense += std::min(ahead, chunk_blocks(blocks, v, c));
  }
  return dense;
}

namespace {

// The most frugal choice with `offloaded` blocks offloaded, over the settings that offload that
// many (all of host memory's when `host_limited`): its memory (infinite when none does) and host bytes.
struct Frugal {
  double memory_bytes = std::numeric_limits<double>::infinity();
  double host_bytes = std::numeric_limits<double>::infinity();
};
Frugal frugal_choice(const CostModel& cost, const StageSlot& slot, int blocks, const OptionPins& pins, int offloaded,
                     bool host_limited) {
  Frugal best;
  for (int sp = 0; sp < 2; ++sp) {
    if (!slot.unit[sp]) continue;
    for (const ZeroSetting& zero : zero_settings(slot, pins)) {
      const int most = host_limited ? stage_max_offloaded(cost, slot, blocks, zero)
                                    : (zero_setting_offloads(slot, zero) ? blocks : 0);
      if (offloaded > most) continue;
      StageOption o;
      o.zero = zero.zero;
      o.shard_gradients = zero.shard;
      o.full = pins.recompute >= 0 && pins.recompute != static_cast<int>(Recompute::Recompute_full) ? 0 : blocks;
      o.selective = pins.recompute == static_cast<int>(Recompute::Recompute_selective) ? blocks : 0;
      o.offloaded = offloaded;
      o.prefetch_depth = stage_prefetch_depths(pins).front();
      const StageChoice choice = stage_choice_of(slot, o, blocks);
      const MemoryBreakdown mem = cost.stage_memory(slot.shape, *slot.unit[sp], choice, slot.in_flight, slot.has_next);
      if (mem.total_bytes() < best.memory_bytes) best = {mem.total_bytes(), mem.host_offload_bytes};
    }
  }
  return best;
}

}  // namespace

double stage_min_memory_bytes(const CostModel& cost, const StageSlot& slot, int blocks, const OptionPins& pins,
                              bool host_limited) {
  // The offload window can outweigh what a few offloaded blocks free: take the best count.
  double best = std::numeric_limits<double>::infinity();
  for (int off : stage_offload_counts(pins.allow_offload ? blocks : 0))
    best = std::min(best, frugal_choice(cost, slot, blocks, pins, off, host_limited).memory_bytes);
  return best;
}

double stage_min_host_bytes(const CostModel& cost, const StageSlot& slot, int blocks, const OptionPins& pins) {
  for (int off : stage_offload_counts(pins.allow_offload ? blocks : 0)) {
    const Frugal f = frugal_choice(cost, slot, blocks, pins, off, false);
    if (f.memory_bytes <= slot.capacity_bytes) return f.host_bytes;
  }
  return std::numeric_limits<double>::infinity();
}

}  // namespace alloy
