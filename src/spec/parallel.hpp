// The vocabulary of parallel-training choices shared by the cost model, the plan and the
// runtime: recomputation levels and pipeline schedules, with their names for files and people.
#pragma once

#include <string>

namespace alloy {

enum class Recompute {
  Recompute_none,       // keep every activation of the layer
  Recompute_selective,  // drop the attention scores, recompute the attention core in backward
  Recompute_full,       // keep only the layer input, recompute the whole layer in backward
};

enum class Schedule {
  Schedule_gpipe,        // all forwards, then all backwards
  Schedule_1f1b,         // PipeDream-flush: warm-up, one forward one backward, cool-down
  Schedule_interleaved,  // interleaved 1F1B with v model chunks per stage
};

const char* recompute_name(Recompute r);
bool recompute_parse(const std::string& text, Recompute* out);
const char* schedule_name(Schedule s);
// Chunk forwards stage `stage` of `stages` runs before its first backward under the interleaved
// schedule with `v` chunks per stage (Megatron-LM's rule): all m * v of them when there are no
// more micro-batches than stages, else 2(p - s - 1) + (v - 1)p, at most m * v. The step schedule
// and the cost model's activation memory both follow it.
int interleaved_warmup_chunks(int stages, int stage, int micro_batches, int v);
// Chunk of the k-th chunk forward (0 <= k < m * v) of the interleaved schedule: micro-batches go
// in groups of p (the last group may be smaller), every chunk for a whole group before the next.
int interleaved_forward_chunk(int k, int stages, int micro_batches, int v);
// Blocks of chunk `chunk` when a stage of `blocks` blocks (>= v) splits into `v` chunks: as even
// as possible, the larger chunks first (the first blocks % v take one block more).
int chunk_blocks(int blocks, int v, int chunk);
bool schedule_parse(const std::string& text, Schedule* out);

}  // namespace alloy
