#include "spec/units.hpp"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace alloy {

namespace {

struct Suffix {
  const char* text;
  double factor;
};

// Splits "12.5 GiB" into 12.5 and "GiB"; false when there is no leading number.
bool split_number(const std::string& text, double* value, std::string* unit) {
  const char* begin = text.c_str();
  while (*begin == ' ' || *begin == '\t') ++begin;
  if (*begin == '\0' || *begin == '-' || *begin == '+') return false;
  if (!std::isdigit(static_cast<unsigned char>(*begin)) && *begin != '.') return false;
  char* end = nullptr;
  double v = std::strtod(begin, &end);
  if (end == begin || !std::isfinite(v) || v < 0) return false;
  std::string rest(end);
  size_t first = rest.find_first_not_of(" \t");
  size_t last = rest.find_last_not_of(" \t");
  *unit = first == std::string::npos ? "" : rest.substr(first, last - first + 1);
  *value = v;
  return true;
}

std::optional<double> parse_with(const std::string& text, const std::vector<Suffix>& suffixes) {
  double value = 0;
  std::string unit;
  if (!split_number(text, &value, &unit)) return std::nullopt;
  for (const auto& s : suffixes) {
    if (unit == s.text) {
      double out = value * s.factor;
      if (!std::isfinite(out)) return std::nullopt;
      return out;
    }
  }
  return std::nullopt;
}

constexpr double kKi = 1024.0, kMi = kKi * 1024, kGi = kMi * 1024, kTi = kGi * 1024;

std::string scaled(double value, const std::vector<std::pair<double, const char*>>& steps) {
  for (const auto& [factor, name] : steps) {
    if (std::abs(value) >= factor) return fmt::format("{:.3g} {}", value / factor, name);
  }
  return fmt::format("{:.3g} {}", value / steps.back().first, steps.back().second);
}

}  // namespace

std::optional<double> units_parse_bytes(const std::string& text) {
  static const std::vector<Suffix> suffixes = {
      {"", 1},      {"B", 1},      {"KB", 1e3},  {"MB", 1e6},  {"GB", 1e9},  {"TB", 1e12},
      {"KiB", kKi}, {"MiB", kMi},  {"GiB", kGi}, {"TiB", kTi}, {"K", kKi},   {"M", kMi},
      {"G", kGi},   {"T", kTi}};
  return parse_with(text, suffixes);
}

std::optional<double> units_parse_bandwidth(const std::string& text) {
  static const std::vector<Suffix> suffixes = {
      {"", 1},           {"B/s", 1},          {"KB/s", 1e3},        {"MB/s", 1e6},
      {"GB/s", 1e9},     {"TB/s", 1e12},      {"GiB/s", kGi},       {"MiB/s", kMi},
      {"Gb/s", 1e9 / 8}, {"Gbps", 1e9 / 8},   {"Mb/s", 1e6 / 8},    {"Mbps", 1e6 / 8},
      {"Tb/s", 1e12 / 8}, {"Tbps", 1e12 / 8}};
  return parse_with(text, suffixes);
}

std::optional<double> units_parse_seconds(const std::string& text) {
  static const std::vector<Suffix> suffixes = {
      {"", 1}, {"s", 1}, {"ms", 1e-3}, {"us", 1e-6}, {"µs", 1e-6}, {"ns", 1e-9}};
  return parse_with(text, suffixes);
}

std::optional<double> units_parse_flops(const std::string& text) {
  static const std::vector<Suffix> suffixes = {
      {"", 1},           {"FLOPS", 1},         {"GFLOPS", 1e9},      {"TFLOPS", 1e12},
      {"PFLOPS", 1e15},  {"FLOP/s", 1},        {"GFLOP/s", 1e9},     {"TFLOP/s", 1e12},
      {"PFLOP/s", 1e15}, {"G", 1e9},           {"T", 1e12},          {"P", 1e15}};
  return parse_with(text, suffixes);
}

std::string units_format_bytes(double bytes) {
  return scaled(bytes, {{kTi, "TiB"}, {kGi, "GiB"}, {kMi, "MiB"}, {kKi, "KiB"}, {1, "B"}});
}

std::string units_format_bandwidth(double bytes_per_second) {
  return scaled(bytes_per_second, {{1e12, "TB/s"}, {1e9, "GB/s"}, {1e6, "MB/s"}, {1e3, "kB/s"}, {1, "B/s"}});
}

std::string units_format_flops(double flops_per_second) {
  return scaled(flops_per_second,
                {{1e18, "EFLOP/s"}, {1e15, "PFLOP/s"}, {1e12, "TFLOP/s"}, {1e9, "GFLOP/s"}, {1, "FLOP/s"}});
}

std::string units_format_seconds(double seconds) {
  if (seconds >= 1) return fmt::format("{:.3g} s", seconds);
  if (seconds >= 1e-3) return fmt::format("{:.3g} ms", seconds * 1e3);
  if (seconds >= 1e-6) return fmt::format("{:.3g} us", seconds * 1e6);
  return fmt::format("{:.3g} ns", seconds * 1e9);
}

std::string units_format_count(double count) {
  return scaled(count, {{1e12, "T"}, {1e9, "B"}, {1e6, "M"}, {1e3, "K"}, {1, ""}});
}

std::string units_format_flop_count(double flops) {
  return scaled(flops, {{1e18, "EFLOP"}, {1e15, "PFLOP"}, {1e12, "TFLOP"}, {1e9, "GFLOP"}, {1e6, "MFLOP"}, {1, "FLOP"}});
}

}  // namespace alloy
