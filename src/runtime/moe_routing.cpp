// Expert parallelism's row bookkeeping (moe_routing.hpp).
#include "runtime/moe_routing.hpp"

#include <algorithm>

namespace alloy {

MoeEpRoute moe_ep_route(const ModelSpec& spec, const ModelShard& shard, const int32_t* offsets, const int64_t* counts) {
  MoeEpRoute r;
  r.G = shard.ep;
  r.E = static_cast<int>(spec.moe.num_experts);
  r.me = shard.ep_rank;
  for (int g = 0; g < r.G; ++g) r.first.push_back(shard_expert_range(spec, shard, g).first);
  r.first.push_back(r.E);
  r.lo = r.first[static_cast<size_t>(r.me)];
  r.hi = r.first[static_cast<size_t>(r.me) + 1];
  r.counts.assign(counts, counts + int64_t{r.G} * r.E);
  for (int g = 0; g < r.G; ++g) {
    r.send_rows.push_back(offsets[r.first[static_cast<size_t>(g) + 1]] - offsets[r.first[static_cast<size_t>(g)]]);
    int64_t rows = 0;
    for (int e = r.lo; e < r.hi; ++e) rows += counts[int64_t{g} * r.E + e];
    r.recv_rows.push_back(rows);
    r.R += rows;
  }
  r.expert_rows.push_back(0);
  for (int e = r.lo; e < r.hi; ++e) {
    int64_t rows = 0;
    for (int g = 0; g < r.G; ++g) rows += counts[int64_t{g} * r.E + e];
    r.expert_rows.push_back(r.expert_rows.back() + rows);
  }
  return r;
}

std::vector<MoeRowCopy> moe_ep_reorder_copies(const MoeEpRoute& r, bool to_expert_major) {
  std::vector<MoeRowCopy> copies;
  std::vector<int64_t> at_expert(r.expert_rows.begin(), r.expert_rows.end() - 1);
  int64_t arrived = 0;
  for (int g = 0; g < r.G; ++g) {
    for (int e = r.lo; e < r.hi; ++e) {
      const int64_t rows = r.counts[static_cast<size_t>(int64_t{g} * r.E + e)];
      int64_t& at = at_expert[static_cast<size_t>(e - r.lo)];
      if (rows > 0) copies.push_back(to_expert_major ? MoeRowCopy{arrived, at, rows} : MoeRowCopy{at, arrived, rows});
      arrived += rows;
      at += rows;
    }
  }
  return copies;
}

int64_t moe_ep_rows_capacity(int64_t R, int NK) {
  const int64_t step = std::max<int64_t>(1, (int64_t{NK} + 7) / 8);
  return (R + step - 1) / step * step;
}

}  // namespace alloy
