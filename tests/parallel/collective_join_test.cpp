// Matching every rank's collective timings on rank 0: one entry per collective that every member
// timed alike, its least time, blocked only when every member waited for it from its call; a
// world and a data-parallel group of the same members kept apart by their roles.
#include <gtest/gtest.h>

#include "runtime/parallel/collective_join.hpp"

namespace alloy {
namespace {

constexpr int32_t kWorld = static_cast<int32_t>(CollectiveGroup::CollectiveGroup_world);
constexpr int32_t kData = static_cast<int32_t>(CollectiveGroup::CollectiveGroup_data);
constexpr int32_t kAllReduce = static_cast<int32_t>(CollectiveOp::CollectiveOp_all_reduce);
constexpr int32_t kAllGather = static_cast<int32_t>(CollectiveOp::CollectiveOp_all_gather);

// A record of the group {0, 1} (members key 7), 1 MB.
CollectiveRecord record(int32_t group, int64_t sequence, int32_t op, double seconds, bool blocked = true) {
  return {7, sequence, group, op, 2, 0, blocked ? 1 : 0, 1000000, seconds};
}

TEST(CollectiveJoin, MembersTimingsOfOneCollectiveBecomeOneEntry) {
  // Rank 0 posted first and waited longer; rank 1 joined last. The world's collective 0 and the
  // data-parallel group's collective 0 have the same members and number.
  const std::vector<std::vector<CollectiveRecord>> by_rank = {
      {record(kWorld, 0, kAllReduce, 5e-3), record(kData, 0, kAllGather, 3e-3, false)},
      {record(kWorld, 0, kAllReduce, 2e-3), record(kData, 0, kAllGather, 4e-3)},
  };
  const std::vector<JoinedCollective> joined = collectives_match(by_rank);
  ASSERT_EQ(joined.size(), 2u);
  const JoinedCollective& world = joined[0].group == CollectiveGroup::CollectiveGroup_world ? joined[0] : joined[1];
  const JoinedCollective& data = joined[0].group == CollectiveGroup::CollectiveGroup_world ? joined[1] : joined[0];
  EXPECT_EQ(world.op, CollectiveOp::CollectiveOp_all_reduce);
  EXPECT_DOUBLE_EQ(world.seconds, 2e-3) << "the member that joined last";
  EXPECT_TRUE(world.blocked);
  EXPECT_EQ(world.ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(data.op, CollectiveOp::CollectiveOp_all_gather);
  EXPECT_DOUBLE_EQ(data.seconds, 3e-3);
  EXPECT_FALSE(data.blocked) << "rank 0 posted it ahead of its wait";
  EXPECT_EQ(world.bytes, 1000000);
}

TEST(CollectiveJoin, IncompleteOrDisagreeingTimingsAreDropped) {
  CollectiveRecord other_bytes = record(kWorld, 1, kAllReduce, 1e-3);
  other_bytes.bytes = 8;
  const std::vector<std::vector<CollectiveRecord>> by_rank = {
      // 0: rank 1 switched timing on after it; 1: the ranks disagree on its size (their
      // numbering went apart); 2: rank 1 sent it twice.
      {record(kWorld, 0, kAllReduce, 1e-3), record(kWorld, 1, kAllReduce, 1e-3)},
      {other_bytes, record(kWorld, 2, kAllReduce, 1e-3), record(kWorld, 2, kAllReduce, 1e-3)},
  };
  EXPECT_TRUE(collectives_match(by_rank).empty());
}

}  // namespace
}  // namespace alloy
