// Strict checks of command-line values: whole numbers and real numbers read without wrap-around,
// trailing text or NaN, each within a stated range; options that do not apply to a run.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace alloy::cli {

// Sanity bounds shared by several commands, as for the specs (docs/architecture.md).
inline constexpr int64_t kOptionMostSteps = 1'000'000'000;
inline constexpr int64_t kOptionMostSequences = 10'000'000;

// Accepts a whole number in [low, high]; CLI11 prefixes the failing flag to the message, which
// states the accepted range.
CLI::Validator option_whole_in(int64_t low, int64_t high);

// Accepts a finite number in [low, high], or in (low, high] when `low_open`.
CLI::Validator option_number_in(double low, double high, bool low_open);

// Throws alloy::Error naming `flag` when it was given on `cmd` while `applies` is false;
// `needs` says what the flag requires, e.g. "--plan".
void option_refuse_unless(const CLI::App& cmd, const char* flag, bool applies, const std::string& needs);

}  // namespace alloy::cli
