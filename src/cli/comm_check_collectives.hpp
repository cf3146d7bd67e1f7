// alloy comm-check's checks of every collective: the table of outcomes gathered by index, the
// groups checked on, and one check per operation whose data each rank can verify on its own.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "runtime/parallel/communicator.hpp"

namespace alloy::cli {

enum class CheckOutcome : uint8_t { CheckOutcome_pass, CheckOutcome_fail, CheckOutcome_not_member };

// One entry per check, in the same order on every rank, so outcomes can be gathered by index.
struct CheckTable {
  std::vector<std::string> names;
  std::vector<std::string> groups;
  std::vector<uint8_t> outcomes;
  std::vector<std::string> notes;  // shown by rank 0 next to the result
};

// A group to check on, with the label the table shows.
struct CheckGroup {
  std::string label;
  CommGroup group;
};

// Runs `check` (returns "" when right, else what is wrong) when this rank is in the group.
void check_run(CheckTable& table, const CheckGroup& g, const std::string& name, int rank,
               const std::function<std::string()>& check);

// The first k in [begin, end) where got(k) != expected(k), described; "" when none.
template <typename Got, typename Expected>
std::string mismatch_find(int64_t begin, int64_t end, Got got, Expected expected) {
  for (int64_t k = begin; k < end; ++k) {
    if (got(k) != expected(k)) return fmt::format("element {} is {}, expected {}", k, got(k), expected(k));
  }
  return "";
}


// Every collective of the Communicator on `g`, each checked against what its members sent;
// `corrupt`: this rank feeds the first all-reduce a wrong value (testing aid).
void group_checks_run(Communicator& comm, CheckTable& table, const CheckGroup& g, int tag, bool corrupt);

// Groups to check on, identical on every rank: world, even/odd ranks, and (from 2 ranks) all
// but the last rank, which then checks that a rank outside every group is left alone.
std::vector<CheckGroup> check_groups(Communicator& comm);

// Calls the communicator must refuse, before any MPI call, with an alloy::Error naming the
// bad value; every rank makes the same calls, so a refused split leaves no rank waiting.
std::string invalid_calls_check(Communicator& comm);

}  // namespace alloy::cli
