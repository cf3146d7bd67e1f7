// Strict checks of command-line values (see option_checks.hpp).
#include "cli/option_checks.hpp"

#include <charconv>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

#include "spec/error.hpp"

namespace alloy::cli {

namespace {

bool whole_parse(const std::string& text, int64_t* value) {
  const char* begin = text.data();
  const char* end = begin + text.size();
  if (begin != end && *begin == '+') ++begin;
  auto [stop, error] = std::from_chars(begin, end, *value);
  return error == std::errc() && stop == end && begin != end;
}

bool number_parse(const std::string& text, double* value) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text.front()))) return false;
  char* stop = nullptr;
  *value = std::strtod(text.c_str(), &stop);
  return *stop == '\0' && std::isfinite(*value);
}

}  // namespace

CLI::Validator option_whole_in(int64_t low, int64_t high) {
  auto check = [low, high](std::string& text) -> std::string {
    int64_t value = 0;
    if (whole_parse(text, &value) && value >= low && value <= high) return {};
    return fmt::format("'{}' is not a whole number in [{}, {}]", text, low, high);
  };
  return CLI::Validator(check, fmt::format("INT in [{}, {}]", low, high));
}

CLI::Validator option_number_in(double low, double high, bool low_open) {
  auto check = [low, high, low_open](std::string& text) -> std::string {
    double value = 0;
    if (number_parse(text, &value) && (low_open ? value > low : value >= low) && value <= high) return {};
    return fmt::format("'{}' is not a finite number in {}{}, {}]", text, low_open ? "(" : "[", low, high);
  };
  return CLI::Validator(check, fmt::format("NUMBER in {}{}, {}]", low_open ? "(" : "[", low, high));
}

void option_refuse_unless(const CLI::App& cmd, const char* flag, bool applies, const std::string& needs) {
  if (applies || cmd.count(flag) == 0) return;
  throw Error(fmt::format("has no effect here: it applies only with {}", needs), {"", flag},
              fmt::format("drop {}, or add {}", flag, needs));
}

}  // namespace alloy::cli
