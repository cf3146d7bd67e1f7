// The planner's options as `alloy plan` and `alloy replan` take them: the profile, the objective
// and every pin of the search, registered once and turned into SearchOptions.
#pragma once

#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "cost/profile.hpp"
#include "search/planner.hpp"

namespace alloy::cli {

struct SearchFlags {
  std::string profile;
  std::string objective = "throughput";
  std::string schedule;
  std::string recompute;
  std::string gradients;
  std::string layer_split;
  std::string device_order;
  int sequence_parallel = -1;
  bool no_offload = false;
  bool even_dp = false;
  bool no_rerank = false;
  SearchOptions search;
};

// Registers the flags on `cmd`, filling `flags`.
void search_flags_add(CLI::App* cmd, SearchFlags& flags);
// Refuses flags that need another one (e.g. --chunks without the interleaved schedule).
void search_flags_check(const CLI::App& cmd, const SearchFlags& flags);
// Throws alloy::Error naming the flag for a value it cannot read.
SearchOptions search_options_from(const SearchFlags& flags);
// The measured profile --profile names, if any.
std::optional<Profile> search_flags_profile(const SearchFlags& flags);
// Searches with `cost` as the flags say (the best few re-ranked by simulation unless
// --no-simulate), prints the plan, the search's statistics and the cost model's notes.
SearchResult search_flags_run(const CostModel& cost, const SearchFlags& flags);

}  // namespace alloy::cli
