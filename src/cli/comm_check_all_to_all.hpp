// alloy comm-check's all-to-all check: variable counts between every pair of members.
#pragma once

#include <string>

#include "runtime/parallel/communicator.hpp"

namespace alloy::cli {

// Every member sends every member (itself included) a piece of its own length, some empty, and
// checks what it receives; "" when right, else the first wrong element described.
std::string comm_check_all_to_all(Communicator& comm, const CommGroup& group);

}  // namespace alloy::cli
