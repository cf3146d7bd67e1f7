// Expert parallelism's row bookkeeping (moe_routing.hpp), which the CPU and CUDA backends share:
// rows sent and received per member, and the copies between arrival and expert-major order.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "runtime/moe_routing.hpp"
#include "spec/model.hpp"

namespace alloy {
namespace {

// Member `me` of `ep` over tiny-moe's 4 experts; offsets: (E + 1) of its own counts (row me of counts).
MoeEpRoute ep_route_of(const ModelSpec& spec, int ep, int me, const std::vector<int64_t>& counts) {
  ModelShard shard = shard_full(spec);
  shard.ep = ep;
  shard.ep_rank = me;
  const int E = static_cast<int>(spec.moe.num_experts);
  std::vector<int32_t> offsets(1, 0);
  for (int e = 0; e < E; ++e)
    offsets.push_back(offsets.back() + static_cast<int32_t>(counts[static_cast<size_t>(me * E + e)]));
  return moe_ep_route(spec, shard, offsets.data(), counts.data());
}

// Row ids moved by `copies` (each row of `out` says which row of `in` it came from; -1: none).
std::vector<int64_t> copies_apply(const std::vector<MoeRowCopy>& copies, const std::vector<int64_t>& in) {
  std::vector<int64_t> out(in.size(), -1);
  for (const MoeRowCopy& c : copies)
    for (int64_t i = 0; i < c.rows; ++i) out[static_cast<size_t>(c.to_row + i)] = in[static_cast<size_t>(c.from_row + i)];
  return out;
}

TEST(MoeRouting, SecondMemberOfTwoSendsReceivesAndReordersItsRows) {
  const ModelSpec spec = model_load("tiny-moe");
  // Rows member g routes to expert e: member 0 [3, 0, 2, 5], member 1 [1, 4, 3, 2].
  const MoeEpRoute r = ep_route_of(spec, 2, 1, {3, 0, 2, 5, 1, 4, 3, 2});
  EXPECT_EQ(r.lo, 2);
  EXPECT_EQ(r.hi, 4);
  EXPECT_EQ(r.send_rows, (std::vector<int64_t>{5, 5}));   // its rows of experts 0-1, then of 2-3
  EXPECT_EQ(r.recv_rows, (std::vector<int64_t>{7, 5}));   // experts 2-3's rows from members 0 and 1
  EXPECT_EQ(r.R, 12);
  EXPECT_EQ(r.expert_rows, (std::vector<int64_t>{0, 5, 12}));
  // Arrival: member 0's 2 rows of expert 2 and 5 of expert 3, then member 1's 3 and 2.
  std::vector<int64_t> arrived(12);
  std::iota(arrived.begin(), arrived.end(), 0);
  const std::vector<int64_t> expert_major = copies_apply(moe_ep_reorder_copies(r, true), arrived);
  EXPECT_EQ(expert_major, (std::vector<int64_t>{0, 1, 7, 8, 9, 2, 3, 4, 5, 6, 10, 11}));
  EXPECT_EQ(copies_apply(moe_ep_reorder_copies(r, false), expert_major), arrived);
}

TEST(MoeRouting, ReorderIsAPermutationThatRoundTripsForAnyCounts) {
  const ModelSpec spec = model_load("tiny-moe");
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> rows(0, 4);
  for (int ep : {1, 2, 4}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<int64_t> counts(static_cast<size_t>(ep) * 4);
      for (int64_t& c : counts) c = rows(rng);
      for (int me = 0; me < ep; ++me) {
        const MoeEpRoute r = ep_route_of(spec, ep, me, counts);
        std::vector<int64_t> arrived(static_cast<size_t>(r.R));
        std::iota(arrived.begin(), arrived.end(), 0);
        const std::vector<int64_t> there = copies_apply(moe_ep_reorder_copies(r, true), arrived);
        std::vector<int64_t> sorted = there;
        std::sort(sorted.begin(), sorted.end());
        EXPECT_EQ(sorted, arrived) << "ep " << ep << " member " << me;
        EXPECT_EQ(copies_apply(moe_ep_reorder_copies(r, false), there), arrived) << "ep " << ep << " member " << me;
        EXPECT_EQ(std::accumulate(r.recv_rows.begin(), r.recv_rows.end(), int64_t{0}), r.R);
        EXPECT_EQ(r.expert_rows.back(), r.R);
      }
    }
  }
}

TEST(MoeRouting, RowsCapacityRoundsUpToAnEighthOfTheOwnRows) {
  EXPECT_EQ(moe_ep_rows_capacity(0, 64), 0);
  EXPECT_EQ(moe_ep_rows_capacity(1, 64), 8);
  EXPECT_EQ(moe_ep_rows_capacity(17, 64), 24);
  EXPECT_EQ(moe_ep_rows_capacity(5, 3), 5);  // steps of one row
}

}  // namespace
}  // namespace alloy
