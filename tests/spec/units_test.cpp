// Quantities with units in spec files.
#include <gtest/gtest.h>

#include "spec/units.hpp"

namespace alloy {
namespace {

TEST(Units, Bytes) {
  EXPECT_DOUBLE_EQ(*units_parse_bytes("80GiB"), 80.0 * (1ull << 30));
  EXPECT_DOUBLE_EQ(*units_parse_bytes("80 GB"), 80e9);
  EXPECT_DOUBLE_EQ(*units_parse_bytes("1024"), 1024.0);
  EXPECT_DOUBLE_EQ(*units_parse_bytes("1.5TiB"), 1.5 * (1ull << 40));
  EXPECT_FALSE(units_parse_bytes("-1GiB"));
  EXPECT_FALSE(units_parse_bytes("GiB"));
  EXPECT_FALSE(units_parse_bytes("80 parsecs"));
  EXPECT_FALSE(units_parse_bytes(""));
}

TEST(Units, BandwidthBitsAndBytes) {
  EXPECT_DOUBLE_EQ(*units_parse_bandwidth("300GB/s"), 300e9);
  EXPECT_DOUBLE_EQ(*units_parse_bandwidth("200Gb/s"), 25e9);
  EXPECT_DOUBLE_EQ(*units_parse_bandwidth("100Gbps"), 12.5e9);
  EXPECT_FALSE(units_parse_bandwidth("300GB"));
}

TEST(Units, SecondsAndFlops) {
  EXPECT_DOUBLE_EQ(*units_parse_seconds("5us"), 5e-6);
  EXPECT_DOUBLE_EQ(*units_parse_seconds("2 ms"), 2e-3);
  EXPECT_DOUBLE_EQ(*units_parse_flops("312TFLOPS"), 312e12);
  EXPECT_DOUBLE_EQ(*units_parse_flops("1.5 PFLOP/s"), 1.5e15);
  EXPECT_FALSE(units_parse_flops("1e400"));
  EXPECT_FALSE(units_parse_seconds("nan"));
}

TEST(Units, Formatting) {
  EXPECT_EQ(units_format_bytes(80.0 * (1ull << 30)), "80 GiB");
  EXPECT_EQ(units_format_flops(312e12), "312 TFLOP/s");
  EXPECT_EQ(units_format_seconds(0.0123), "12.3 ms");
}

}  // namespace
}  // namespace alloy
