// The device arena: alignment, exact accounting, peak tracking and the capacity error.
#include <gtest/gtest.h>

#include <cstdint>

#include "runtime/arena.hpp"
#include "spec/error.hpp"

namespace alloy {
namespace {

TEST(Arena, AlignsAndCountsRoundedBytes) {
  Arena arena(1 << 20);
  void* a = arena.allocate(100, "a");
  void* b = arena.allocate(64, "b");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % kArenaAlignmentBytes, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % kArenaAlignmentBytes, 0u);
  EXPECT_EQ(arena.bytes_in_use(), 128 + 64);
  arena.release(a);
  EXPECT_EQ(arena.bytes_in_use(), 64);
  EXPECT_EQ(arena.peak_bytes(), 192);
  arena.reset_peak();
  EXPECT_EQ(arena.peak_bytes(), 64);
  void* c = arena.allocate(128, "c");  // reuses a's block
  EXPECT_EQ(c, a);
  EXPECT_EQ(arena.peak_bytes(), 192);
  arena.release(b);
  arena.release(c);
  EXPECT_EQ(arena.bytes_in_use(), 0);
}

TEST(Arena, OverCapacityThrowsWithNumbersAndHint) {
  Arena arena(1000, "cpu:3");
  EXPECT_EQ(arena.device_name(), "cpu:3");
  void* a = arena.allocate(600, "weights");
  try {
    arena.allocate(512, "activations");
    FAIL() << "expected an out-of-memory error";
  } catch (const Error& error) {
    const std::string text = error.format();
    EXPECT_NE(text.find("activations"), std::string::npos) << text;
    EXPECT_NE(text.find("512 bytes"), std::string::npos) << text;
    EXPECT_NE(text.find("recomputation"), std::string::npos) << text;
    EXPECT_NE(text.find("cpu:3"), std::string::npos) << text;
  }
  EXPECT_EQ(arena.bytes_in_use(), 640);  // the failed request left nothing behind
  arena.release(a);
  EXPECT_THROW(arena.release(a), Error);
  arena.trim();  // cached blocks go back to the system; accounting is unchanged
  EXPECT_EQ(arena.bytes_in_use(), 0);
  EXPECT_THROW(Arena(0), Error);
}

TEST(Arena, NamesWhatFilledItAtThePeak) {
  Arena arena(1 << 20, "cpu:0");
  void* weights = arena.allocate(1000, "weights");
  void* a = arena.allocate(200, "activations");
  void* b = arena.allocate(200, "activations");
  arena.release(a);
  arena.release(b);
  void* small = arena.allocate(64, "workspace");  // below the peak: the breakdown stays
  const auto breakdown = arena.peak_breakdown();
  ASSERT_EQ(breakdown.size(), 2u);
  EXPECT_EQ(breakdown[0].first, "weights");
  EXPECT_EQ(breakdown[0].second, arena_rounded_bytes(1000));
  EXPECT_EQ(breakdown[1].first, "activations");
  EXPECT_EQ(breakdown[1].second, 2 * arena_rounded_bytes(200));
  EXPECT_EQ(breakdown[0].second + breakdown[1].second, arena.peak_bytes());
  arena.release(small);
  arena.release(weights);
}

// A new high-water mark starts from what is live, so a step that never passes it still reports
// a breakdown that sums to its peak (not the previous step's).
TEST(Arena, ResetPeakStartsTheBreakdownFromWhatIsLive) {
  Arena arena(1 << 20);
  void* weights = arena.allocate(1000, "weights");
  void* a = arena.allocate(4000, "activations");
  arena.release(a);
  arena.reset_peak();
  const auto breakdown = arena.peak_breakdown();
  ASSERT_EQ(breakdown.size(), 1u);
  EXPECT_EQ(breakdown[0].first, "weights");
  EXPECT_EQ(breakdown[0].second, arena.peak_bytes());
  arena.release(weights);
}

}  // namespace
}  // namespace alloy
