#include "spec/parallel.hpp"

#include <algorithm>

namespace alloy {

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::Recompute_none: return "none";
    case Recompute::Recompute_selective: return "selective";
    case Recompute::Recompute_full: return "full";
  }
  return "?";
}

bool recompute_parse(const std::string& text, Recompute* out) {
  for (Recompute r : {Recompute::Recompute_none, Recompute::Recompute_selective, Recompute::Recompute_full}) {
    if (text == recompute_name(r)) {
      *out = r;
      return true;
    }
  }
  return false;
}

int interleaved_warmup_chunks(int stages, int stage, int micro_batches, int v) {
  const int total = micro_batches * v;
  if (micro_batches <= stages) return total;
  return std::min(total, (stages - stage - 1) * 2 + (v - 1) * stages);
}

int interleaved_forward_chunk(int k, int stages, int micro_batches, int v) {
  const int group = k / (stages * v);
  const int group_size = std::min(stages, micro_batches - group * stages);
  return (k - group * stages * v) / group_size;
}

int chunk_blocks(int blocks, int v, int chunk) { return blocks / v + (chunk < blocks % v ? 1 : 0); }

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::Schedule_gpipe: return "gpipe";
    case Schedule::Schedule_1f1b: return "1f1b";
    case Schedule::Schedule_interleaved: return "interleaved";
  }
  return "?";
}

bool schedule_parse(const std::string& text, Schedule* out) {
  for (Schedule s : {Schedule::Schedule_gpipe, Schedule::Schedule_1f1b, Schedule::Schedule_interleaved}) {
    if (text == schedule_name(s)) {
      *out = s;
      return true;
    }
  }
  return false;
}

}  // namespace alloy
