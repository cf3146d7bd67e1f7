// Quantities with units as people write them in spec files: "80GiB", "300GB/s", "200Gb/s",
// "5us", "312TFLOPS". A bare number is taken in base units (bytes, bytes/s, seconds, FLOP/s).
#pragma once

#include <optional>
#include <string>

namespace alloy {

// Binary byte units: memory capacities and sizes are binary (docs/catalog.md).
inline constexpr double kMiB = 1024.0 * 1024.0;
inline constexpr double kGiB = 1024.0 * kMiB;

// Each returns nullopt when the text is not a non-negative finite quantity of that kind.
std::optional<double> units_parse_bytes(const std::string& text);
std::optional<double> units_parse_bandwidth(const std::string& text);  // bytes per second
std::optional<double> units_parse_seconds(const std::string& text);
std::optional<double> units_parse_flops(const std::string& text);      // FLOP per second

// Human-readable forms for tables: "80.0 GiB", "300 GB/s", "312 TFLOP/s", "5.0 us".
std::string units_format_bytes(double bytes);
std::string units_format_bandwidth(double bytes_per_second);
std::string units_format_flops(double flops_per_second);
std::string units_format_seconds(double seconds);
std::string units_format_count(double count);  // 6.74 B, 124.4 M
std::string units_format_flop_count(double flops);  // 14.3 GFLOP

}  // namespace alloy
