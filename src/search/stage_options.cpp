// The Pareto set of a stage's options (stage_options.hpp): the exact enumeration, and the
// affine fast path that scores recomputation and offload counts arithmetically.
#include "search/stage_options.hpp"
#include "search/zero_settings.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace alloy {

namespace {

struct Context {
  const CostModel& cost;
  const StageSlot& slot;
  const StageUnitCosts& unit;
  int blocks;
  int zero;
  bool shard;           // ZeRO 2-3 gradients reduce-scattered every micro-batch (StageOption)
  int depth;            // offload prefetch depth
  double sync_seconds;  // exposed gradient sync per step: the same for every count and depth
  int parked = 0;       // blocks whose saved activations wait in host memory (pinned)
};


double memory_bytes(const Context& c, int selective, int full, int offloaded) {
  StageOption o;
  o.parked = c.parked;
  o.zero = c.zero;
  o.shard_gradients = c.shard;
  o.prefetch_depth = c.depth;
  o.selective = selective;
  o.full = full;
  o.offloaded = offloaded;
  return c.cost.stage_memory(c.slot.shape, c.unit, stage_choice_of(c.slot, o, c.blocks), c.slot.in_flight,
                             c.slot.has_next).total_bytes();
}

bool fits(const Context& c, int selective, int full, int offloaded) {
  return memory_bytes(c, selective, full, offloaded) <= c.slot.capacity_bytes;
}

// Smallest number of selective blocks in [lo, hi] that fits, given `full` and `offloaded`;
// memory falls as blocks move from none to selective. -1 when even `hi` does not fit.
int min_selective(const Context& c, int lo, int hi, int full, int offloaded) {
  if (lo > hi || !fits(c, hi, full, offloaded)) return -1;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (fits(c, mid, full, offloaded)) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}


// Cheapest recomputation (extra backward seconds) that fits, trying every count of fully
// recomputed blocks with a binary search on the selective count. Exact and slow.
bool cheapest_recompute_search(const Context& c, int offloaded, int* selective, int* full) {
  const int n = c.blocks;
  const double r_sel = c.unit.recompute_selective_seconds;
  const double r_full = c.unit.recompute_full_seconds;
  double best = std::numeric_limits<double>::infinity();
  for (int f = 0; f <= n; ++f) {
    if (f * r_full >= best) break;
    const int sel = min_selective(c, f == 0 ? 1 : 0, n - f, f, offloaded);
    if (sel < 0) continue;
    const double extra = sel * r_sel + f * r_full;
    if (extra < best) {
      best = extra;
      *selective = sel;
      *full = f;
    }
  }
  return best < std::numeric_limits<double>::infinity();
}

// When selective recomputation frees nothing (fused attention keeps no scores), only full
// recomputation saves memory: the fewest fully recomputed blocks that fit. Memory is affine in
// their count from one block on, so two evaluations place it and exact checks settle it.
bool cheapest_full_recompute(const Context& c, int offloaded, int* selective, int* full) {
  const int n = c.blocks;
  *selective = 0;
  const double one = memory_bytes(c, 0, 1, offloaded);
  const double per_block = n >= 2 ? one - memory_bytes(c, 0, 2, offloaded) : 0;
  int f = 1;
  if (per_block > 0) f = std::clamp(1 + static_cast<int>(std::ceil((one - c.slot.capacity_bytes) / per_block - 1e-9)), 1, n);
  while (f < n && !fits(c, 0, f, offloaded)) ++f;
  while (f > 1 && fits(c, 0, f - 1, offloaded)) --f;
  *full = f;
  return fits(c, 0, f, offloaded);
}

// Cheapest recomputation that fits with `offloaded` blocks offloaded. Once any block is
// recomputed, memory is affine in the selective and full counts, so three evaluations give the
// slopes and every full count is scored arithmetically; the winner is then checked exactly.
bool cheapest_recompute(const Context& c, int recompute_pin, int offloaded, int* selective, int* full) {
  const int n = c.blocks;
  if (recompute_pin >= 0) {
    *selective = recompute_pin == static_cast<int>(Recompute::Recompute_selective) ? n : 0;
    *full = recompute_pin == static_cast<int>(Recompute::Recompute_full) ? n : 0;
    return fits(c, *selective, *full, offloaded);
  }
  if (fits(c, 0, 0, offloaded)) {
    *selective = 0;
    *full = 0;
    return true;
  }
  if (!fits(c, 0, n, offloaded)) return false;  // all-full is the most frugal
  if (n < 2) return cheapest_recompute_search(c, offloaded, selective, full);
  const double one_sel = memory_bytes(c, 1, 0, offloaded);
  const double per_sel = one_sel - memory_bytes(c, 2, 0, offloaded);
  const double base = one_sel + per_sel;  // intercept of the affine region
  const double per_full = base - memory_bytes(c, 0, 1, offloaded);
  if (per_sel <= 0 && per_full > 0) return cheapest_full_recompute(c, offloaded, selective, full);
  if (per_sel <= 0 || per_full <= 0) return cheapest_recompute_search(c, offloaded, selective, full);
  const double r_sel = c.unit.recompute_selective_seconds;
  const double r_full = c.unit.recompute_full_seconds;
  const double cap = c.slot.capacity_bytes;
  double best = std::numeric_limits<double>::infinity();
  for (int f = 0; f <= n; ++f) {
    if (f * r_full >= best) break;
    const double need = (base - f * per_full - cap) / per_sel;
    const int sel = std::max(f == 0 ? 1 : 0, static_cast<int>(std::ceil(need - 1e-9)));
    if (sel > n - f) continue;
    const double extra = sel * r_sel + f * r_full;
    if (extra < best) {
      best = extra;
      *selective = sel;
      *full = f;
    }
  }
  if (best == std::numeric_limits<double>::infinity()) return cheapest_recompute_search(c, offloaded, selective, full);
  // Rounding at the capacity boundary: settle the winner on the exact memory.
  while (*selective <= n - *full && !fits(c, *selective, *full, offloaded)) ++*selective;
  if (*selective > n - *full) return cheapest_recompute_search(c, offloaded, selective, full);
  while (*selective > (*full == 0 ? 1 : 0) && fits(c, *selective - 1, *full, offloaded)) --*selective;
  return true;
}

StageOption option_timing(const Context& c, int selective, int full, int offloaded) {
  StageOption o;
  o.parked = c.parked;
  o.zero = c.zero;
  o.shard_gradients = c.shard;
  o.prefetch_depth = c.depth;
  o.sequence_parallel = c.unit.sequence_parallel;
  o.selective = selective;
  o.full = full;
  o.offloaded = offloaded;
  StageTiming t = c.cost.stage_timing_without_sync(c.slot.shape, c.unit, stage_choice_of(c.slot, o, c.blocks),
                                                   c.slot.boundary_seconds, c.slot.chunks_sent);
  t.gradient_sync_seconds = c.sync_seconds;
  o.t = t.per_micro_batch_seconds();
  o.u = t.step_overhead_seconds();
  return o;
}

// A pinned sequence parallelism binds stages with tp > 1; a stage of tp 1 has none to pin.
bool sequence_parallel_pin_allows(const OptionPins& pins, const StageSlot& slot, int sp) {
  return pins.sequence_parallel < 0 || pins.sequence_parallel == sp || slot.shape.tp == 1;
}


// Options without recomputation of one (sp, zero) pair, by offloaded count and depth. Exact, each
// priced by the cost model; or arithmetic: the stage without offload plus the exposed copies,
// with an overhead affine in the count from one block on (offloaded blocks update at the host's
// rate, and the optimizer waits once for the last gradients' copy). Arithmetic needs no parked
// activations.
class PlainTimes {
 public:
  PlainTimes(const Context& first, int most_offloaded, bool arithmetic)
      : first_(first), arithmetic_(arithmetic && first.parked == 0), bare_(option_timing(first, 0, 0, 0)) {
    last_u_ = most_offloaded > 0 ? option_timing(first, 0, 0, most_offloaded).u : bare_.u;
    if (arithmetic_ && most_offloaded > 0) {
      u_one_ = most_offloaded == 1 ? last_u_ : option_timing(first, 0, 0, 1).u;
      u_per_block_ = most_offloaded > 1 ? (last_u_ - u_one_) / (most_offloaded - 1) : 0;
    }
  }

  const StageOption& bare() const { return bare_; }
  double most_offloaded_u() const { return last_u_; }

  StageOption at(const Context& c, int offloaded) const {
    if (offloaded == 0 && c.depth == first_.depth) return bare_;
    if (!arithmetic_) return option_timing(c, 0, 0, offloaded);
    StageOption o = bare_;
    o.prefetch_depth = c.depth;
    o.offloaded = offloaded;
    if (offloaded == 0) return o;
    const OffloadExposure e = c.cost.stage_offload_exposure(c.unit, stage_choice_of(c.slot, o, c.blocks));
    o.t = bare_.t + e.forward_seconds + e.backward_seconds;
    o.u = u_one_ + (offloaded - 1) * u_per_block_;
    return o;
  }

 private:
  const Context& first_;
  bool arithmetic_;
  StageOption bare_;
  double last_u_ = 0;
  double u_one_ = 0;
  double u_per_block_ = 0;
};

// Times without recomputation at the shallowest depth, per offload count, each computed once.
// A deeper prefetch only adds window memory (so recomputation too) unless it hides more of the
// copies: when it is no faster than the shallowest depth at a count, that depth's option
// dominates it (or ties, and ties go to the smaller depth).
class ShallowTimes {
 public:
  ShallowTimes(const PlainTimes& plain, const Context& shallowest, size_t counts)
      : plain_(plain), shallowest_(shallowest), t_(counts, std::numeric_limits<double>::quiet_NaN()) {}

  // `plain`: the option without recomputation at count index `i` and the depth of `c`.
  bool deeper_gains_nothing(const Context& c, size_t i, int offloaded, const StageOption& plain) {
    if (c.depth == shallowest_.depth) {
      t_[i] = plain.t;
      return false;
    }
    if (offloaded == 0) return false;
    if (std::isnan(t_[i])) t_[i] = plain_.at(shallowest_, offloaded).t;
    return plain.t >= t_[i];
  }

 private:
  const PlainTimes& plain_;
  const Context& shallowest_;
  std::vector<double> t_;
};

// True when an option of the front found so far is at least as fast with no more overhead.
// Recomputation only adds time, so an option whose time without it is dominated is dominated
// too; when the overhead grows with the offloaded count, so are the larger counts at the same
// depth (their copies only grow).
bool dominated(const std::vector<StageOption>& front, const StageOption& plain) {
  for (const StageOption& o : front)
    if (o.t <= plain.t && o.u <= plain.u) return true;
  return false;
}

// A deeper prefetch only hides copies that the shallowest depth exposes, and the exposure grows
// with the offloaded count: when the largest count exposes nothing, no deeper depth can win.
bool copies_hidden_at_most_offload(const Context& c, int most, int shallowest) {
  if (most == 0) return true;
  StageOption o;
  o.parked = c.parked;
  o.zero = c.zero;
  o.shard_gradients = c.shard;
  o.prefetch_depth = shallowest;
  o.offloaded = most;
  const OffloadExposure e = c.cost.stage_offload_exposure(c.unit, stage_choice_of(c.slot, o, c.blocks));
  return e.forward_seconds + e.backward_seconds <= 0;
}

// The offload counts of the space (stage_offload_counts) that host memory holds at the setting,
// without 0 where the setting is kept only for its offloading options.
std::vector<int> offload_counts(const CostModel& cost, const StageSlot& slot, int blocks, const OptionPins& pins,
                                const PricedSetting& priced) {
  std::vector<int> counts = stage_offload_counts(pins.allow_offload ? blocks : 0);
  const int most = stage_max_offloaded(cost, slot, blocks, priced.zero);
  counts.erase(std::remove_if(counts.begin(), counts.end(), [&](int n) { return n > most || (n == 0 && priced.offload_only); }),
               counts.end());
  return counts;
}

// Adds `o` to a Pareto front (t ascending, u strictly descending) unless an option there is at
// least as good; at equal cost the smaller prefetch window stays.
void front_add(std::vector<StageOption>* front, const StageOption& o) {
  for (const StageOption& x : *front)
    if (x.t <= o.t && x.u <= o.u && !(x.t == o.t && x.u == o.u && o.prefetch_depth < x.prefetch_depth)) return;
  std::erase_if(*front, [&](const StageOption& x) { return o.t <= x.t && o.u <= x.u; });
  const auto faster = [](const StageOption& x, const StageOption& y) { return x.t < y.t; };
  front->insert(std::upper_bound(front->begin(), front->end(), o, faster), o);
}

// The reference enumeration: every evaluation exact. Used for small stages and whenever the
// affine fast path below cannot vouch for its answer.
void stage_options_exact(const CostModel& cost, const StageSlot& slot, int blocks, const OptionPins& pins,
                         std::vector<StageOption>* out) {
  out->clear();
  const int parked = std::min(pins.offload_activations, blocks);
  const std::vector<int> depths = stage_prefetch_depths(pins);
  for (int sp = 0; sp < 2; ++sp) {
    if (!slot.unit[sp] || !sequence_parallel_pin_allows(pins, slot, sp)) continue;
    for (const PricedSetting& priced : priced_zero_settings(cost, slot, *slot.unit[sp], blocks, pins)) {
      const ZeroSetting& zero = priced.zero;
      const double sync = priced.sync_seconds;
      const std::vector<int> counts = offload_counts(cost, slot, blocks, pins, priced);
      if (counts.empty()) continue;
      const Context first{cost, slot, *slot.unit[sp], blocks, zero.zero, zero.shard, depths.front(), sync, parked};
      // Overhead does not depend on the depth; offload only adds time per block.
      const PlainTimes plain_times(first, counts.back(), false);
      const double last_u = plain_times.most_offloaded_u();
      bool offload_cannot_win = false;
      // Offload adds time per block; when it adds overhead too, a dominated count ends its depth,
      // and (with no activations parked, whose copies a deeper depth hides) a dominated stage
      // without offload or recomputation ends the whole (sp, zero) pair.
      const StageOption& bare = plain_times.bare();
      const bool u_grows = last_u >= bare.u;
      if (u_grows && parked == 0 && dominated(*out, bare)) continue;
      ShallowTimes shallow(plain_times, first, counts.size());
      const bool shallow_suffices = pins.prefetch_depth == 0 && copies_hidden_at_most_offload(first, counts.back(), depths.front());
      for (int depth : depths) {
        if (shallow_suffices && depth != depths.front()) break;
        if (offload_cannot_win) break;
        const Context c{cost, slot, *slot.unit[sp], blocks, zero.zero, zero.shard, depth, sync, parked};
        for (size_t i = 0; i < counts.size(); ++i) {
          const int off = counts[i];
          if (off == 0 && parked == 0 && depth != depths.front()) continue;  // without offload the depth changes nothing
          const StageOption plain = plain_times.at(c, off);
          if (shallow.deeper_gains_nothing(c, i, off, plain)) continue;
          if (dominated(*out, plain)) {
            if (u_grows) break;
            continue;
          }
          int sel = 0;
          int full = 0;
          if (cheapest_recompute(c, pins.recompute, off, &sel, &full)) {
            const StageOption o = option_timing(c, sel, full, off);
            front_add(out, o);
            offload_cannot_win = off == 0 && last_u >= o.u && (pins.recompute >= 0 || sel + full == 0);
            // Fits without recomputation: more offload helps only if it lowers the overhead.
            if (sel == 0 && full == 0 && pins.recompute < 0 && (off == counts.back() || last_u >= o.u)) break;
          }
        }
      }
    }
  }
}

// Memory is affine in the selective and full counts (apart from the recomputation transient,
// which appears once any block recomputes), so a few exact evaluations give the coefficients
// and the counts are scored arithmetically. Offload takes each offloaded block's resident state
// off the device and adds a window of min(count, depth + 1) blocks: two more evaluations place
// it. Time's exposed copies are not linear in the count, so each count's time is evaluated
// exactly. The winners are checked exactly at the end.
struct AffineStage {
  double memory = 0;        // no recomputation, no offload
  double per_selective = 0;
  double per_full = 0;
  double transient = 0;       // added once any block recomputes selectively, none fully
  double full_transient = 0;  // added once any block recomputes fully (it rebuilds more)
  double per_offloaded = 0; // each offloaded block's resident state (negative)
  double per_window = 0;    // each block of the offload window

  // Memory added by `offloaded` blocks at prefetch `depth`.
  double offload_delta(int offloaded, int depth) const {
    return offloaded > 0 ? offloaded * per_offloaded + std::min(offloaded, depth + 1) * per_window : 0;
  }
  // Memory with `offload_delta` bytes added by the offloaded blocks.
  double at(int sel, int full, double offload_delta) const {
    return memory + offload_delta + (full > 0 ? full_transient : sel > 0 ? transient : 0) + sel * per_selective +
           full * per_full;
  }
};

// The coefficients at `c`'s ZeRO stage. Recomputation frees activations only, the same at every
// ZeRO stage: `same_activations`, when given, lends its recomputation coefficients.
AffineStage affine_stage(const Context& c, bool offload, const AffineStage* same_activations) {
  AffineStage a;
  a.memory = memory_bytes(c, 0, 0, 0);
  if (same_activations) {
    a.per_selective = same_activations->per_selective;
    a.transient = same_activations->transient;
    a.per_full = same_activations->per_full;
    a.full_transient = same_activations->full_transient;
  } else {
    const double one_sel = memory_bytes(c, 1, 0, 0);
    a.per_selective = memory_bytes(c, 2, 0, 0) - one_sel;
    a.transient = one_sel - a.memory - a.per_selective;
    const double one_full = memory_bytes(c, 0, 1, 0);
    a.per_full = memory_bytes(c, 0, 2, 0) - one_full;
    a.full_transient = one_full - a.memory - a.per_full;
  }
  if (offload) {
    // At depth 1: one block is A + W, three are 3A + 2W.
    Context shallow = c;
    shallow.depth = 1;
    const double one = memory_bytes(shallow, 0, 0, 1) - a.memory;
    const double three = memory_bytes(shallow, 0, 0, 3) - a.memory;
    a.per_window = 3 * one - three;
    a.per_offloaded = one - a.per_window;
  }
  return a;
}

// Cheapest recomputation that fits with offload changing memory by `off` bytes, on the affine model.
bool affine_recompute(const Context& c, const AffineStage& a, int recompute_pin, double off, int* selective, int* full) {
  const int n = c.blocks;
  const double cap = c.slot.capacity_bytes;
  if (recompute_pin >= 0) {
    *selective = recompute_pin == static_cast<int>(Recompute::Recompute_selective) ? n : 0;
    *full = recompute_pin == static_cast<int>(Recompute::Recompute_full) ? n : 0;
    return a.at(*selective, *full, off) <= cap;
  }
  if (a.at(0, 0, off) <= cap) {
    *selective = 0;
    *full = 0;
    return true;
  }
  if (!(a.per_selective < 0)) {  // selective frees nothing (fused attention): the fewest full blocks
    const double excess = a.at(0, 0, off) + a.full_transient - cap;
    const int f = std::max(1, static_cast<int>(std::ceil(excess / -a.per_full - 1e-9)));
    if (f > n) return false;
    *selective = 0;
    *full = f;
    return true;
  }
  const double r_sel = c.unit.recompute_selective_seconds;
  const double r_full = c.unit.recompute_full_seconds;
  double best = std::numeric_limits<double>::infinity();
  // Fewer full blocks than this cannot fit even with every other block selective (one block
  // of slack for rounding): sel(f) <= n - f needs f >= (R + S n) / (S - F).
  const double excess = a.memory + off + std::min(a.transient, a.full_transient) - cap;
  const double first_full = (excess + a.per_selective * n) / (a.per_selective - a.per_full);
  const int f_start = std::max(0, static_cast<int>(std::floor(first_full)) - 1);
  for (int f = f_start; f <= n; ++f) {
    if (f * r_full >= best) break;
    const double need = (a.at(0, f, off) + (f == 0 ? a.transient : 0) - cap) / -a.per_selective;
    const int sel = std::max(f == 0 ? 1 : 0, static_cast<int>(std::ceil(need - 1e-9)));
    if (sel > n - f) continue;
    const double extra = sel * r_sel + f * r_full;
    if (extra < best) {
      best = extra;
      *selective = sel;
      *full = f;
    }
  }
  return best < std::numeric_limits<double>::infinity();
}

// Moves an affine estimate of the cheapest recomputation with `offloaded` blocks to the exact
// memory: fewer full, then fewer selective blocks while they still fit. False when the estimate
// does not fit at all (the affine model cannot be trusted here).
bool settle_recompute(const Context& c, int offloaded, int* selective, int* full) {
  if (!fits(c, *selective, *full, offloaded)) return false;
  if (*selective == 0) {
    while (*full > 0 && fits(c, 0, *full - 1, offloaded)) --*full;
    return true;
  }
  while (*selective > (*full == 0 ? 1 : 0) && fits(c, *selective - 1, *full, offloaded)) --*selective;
  return true;
}

// Returns false when the affine model cannot be trusted here (the caller falls back).
bool stage_options_affine(const CostModel& cost, const StageSlot& slot, int blocks, const OptionPins& pins,
                          std::vector<StageOption>* out) {
  out->clear();
  const std::vector<int> depths = stage_prefetch_depths(pins);
  for (int sp = 0; sp < 2; ++sp) {
    if (!slot.unit[sp] || !sequence_parallel_pin_allows(pins, slot, sp)) continue;
    AffineStage activations;  // recomputation coefficients of this sp, from its first ZeRO stage
    bool have_activations = false;
    for (const PricedSetting& priced : priced_zero_settings(cost, slot, *slot.unit[sp], blocks, pins)) {
      const ZeroSetting& zero = priced.zero;
      const double sync = priced.sync_seconds;
      const std::vector<int> counts = offload_counts(cost, slot, blocks, pins, priced);
      if (counts.empty()) continue;
      const Context first{cost, slot, *slot.unit[sp], blocks, zero.zero, zero.shard, depths.front(), sync};
      // Overhead does not depend on the depth; offload only adds time per block.
      const PlainTimes plain_times(first, counts.back(), true);
      const double last_u = plain_times.most_offloaded_u();
      bool offload_cannot_win = false;
      // Offload adds time per block; when it adds overhead too, a dominated count ends its depth,
      // and a dominated stage without offload or recomputation ends the whole (sp, zero) pair.
      const StageOption& bare = plain_times.bare();
      const bool u_grows = last_u >= bare.u;
      if (u_grows && dominated(*out, bare)) continue;
      const AffineStage a = affine_stage(first, counts.back() > 0, have_activations ? &activations : nullptr);
      if (!(a.per_selective <= 0) || !(a.per_full < a.per_selective)) return false;
      activations = a;
      have_activations = true;
      ShallowTimes shallow(plain_times, first, counts.size());
      const bool shallow_suffices = pins.prefetch_depth == 0 && copies_hidden_at_most_offload(first, counts.back(), depths.front());
      for (int depth : depths) {
        if (shallow_suffices && depth != depths.front()) break;
        if (offload_cannot_win) break;
        const Context c{cost, slot, *slot.unit[sp], blocks, zero.zero, zero.shard, depth, sync};
        for (size_t i = 0; i < counts.size(); ++i) {
          const int off = counts[i];
          if (off == 0 && depth != depths.front()) continue;  // without offload the depth changes nothing
          const StageOption plain = plain_times.at(c, off);
          if (shallow.deeper_gains_nothing(c, i, off, plain)) continue;
          if (dominated(*out, plain)) {
            if (u_grows) break;
            continue;
          }
          int sel = 0;
          int full = 0;
          if (!affine_recompute(c, a, pins.recompute, a.offload_delta(off, depth), &sel, &full)) continue;
          // The affine model rounds at the capacity: settle the counts on the exact memory now,
          // or an over-estimate here lets another option dominate this one and the exact check
          // of the survivors below never sees it.
          if (pins.recompute < 0 && !settle_recompute(c, off, &sel, &full)) return false;
          StageOption o = plain;
          o.selective = sel;
          o.full = full;
          o.t += sel * c.unit.recompute_selective_seconds + full * c.unit.recompute_full_seconds;
          front_add(out, o);
          // Without offload it fits at a recomputation offload cannot lower, and offload does not
          // lower the overhead: no deeper prefetch can win either.
          offload_cannot_win = off == 0 && last_u >= o.u && (pins.recompute >= 0 || sel + full == 0);
          if (sel == 0 && full == 0 && pins.recompute < 0 && last_u >= o.u) break;
        }
      }
    }
  }
  // Settle the survivors on the exact cost model: time and overhead (offload was priced
  // arithmetically) and memory.
  const auto close = [](double a, double b) { return std::abs(a - b) <= 1e-9 * std::max(std::abs(a), std::abs(b)); };
  for (const StageOption& o : *out) {
    const StageUnitCosts& unit = *slot.unit[o.sequence_parallel ? 1 : 0];
    const ZeroSetting zero{o.zero, o.shard_gradients};
    const Context c{cost, slot, unit, blocks, o.zero, o.shard_gradients, o.prefetch_depth,
                    gradient_sync_seconds(cost, slot, unit, blocks, zero)};
    const StageOption exact = option_timing(c, o.selective, o.full, o.offloaded);
    if (!close(exact.t, o.t) || !close(exact.u, o.u)) return false;
    if (!fits(c, o.selective, o.full, o.offloaded)) return false;
    if (pins.recompute < 0 && o.selective + o.full > 0) {
      // A cheaper recomputation must not fit (rounding at the boundary).
      if (o.selective > (o.full == 0 ? 1 : 0) && fits(c, o.selective - 1, o.full, o.offloaded)) return false;
      if (o.selective + o.full > 0 && fits(c, 0, 0, o.offloaded)) return false;
      if (o.selective == 0 && o.full > 1 && fits(c, 0, o.full - 1, o.offloaded)) return false;
    }
  }
  return true;
}

}  // namespace

void stage_options(const CostModel& cost, const StageSlot& slot, int blocks, const OptionPins& pins,
                   std::vector<StageOption>* out) {
  // Parked activations move the recomputation's memory steps: only the exact path prices them.
  if (blocks >= 3 && pins.offload_activations == 0 && stage_options_affine(cost, slot, blocks, pins, out)) return;
  stage_options_exact(cost, slot, blocks, pins, out);
}

}  // namespace alloy
