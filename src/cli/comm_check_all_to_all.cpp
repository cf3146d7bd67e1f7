// alloy comm-check's all-to-all check (comm_check_all_to_all.hpp).
#include "cli/comm_check_all_to_all.hpp"

#include <fmt/format.h>

namespace alloy::cli {

namespace {

// Floats member i sends member j: uneven, and none for every third pair.
int64_t a2a_check_count(int i, int j) { return (i + 2 * j) % 3 == 0 ? 0 : 300 + 37 * i + 11 * j; }

// Element k of the piece world rank `from` sends member j.
float a2a_check_value(int from, int j, int64_t k) { return static_cast<float>(from * 100000 + j * 1000 + k % 997); }

}  // namespace

std::string comm_check_all_to_all(Communicator& comm, const CommGroup& group) {
  const int n = group.size();
  const int me = group.my_index;
  std::vector<int64_t> send_counts, recv_counts;
  std::vector<float> send;
  for (int j = 0; j < n; ++j) {
    send_counts.push_back(a2a_check_count(me, j));
    recv_counts.push_back(a2a_check_count(j, me));
    for (int64_t k = 0; k < send_counts.back(); ++k) send.push_back(a2a_check_value(comm.rank(), j, k));
  }
  int64_t total = 0;
  for (int64_t c : recv_counts) total += c;
  std::vector<float> recv(static_cast<size_t>(total), -1.0f);
  comm.all_to_all(send.data(), send_counts, recv.data(), recv_counts, group).wait();
  int64_t at = 0;
  for (int j = 0; j < n; ++j) {
    for (int64_t k = 0; k < recv_counts[static_cast<size_t>(j)]; ++k, ++at) {
      const float expected = a2a_check_value(group.members[static_cast<size_t>(j)], me, k);
      if (recv[static_cast<size_t>(at)] != expected)
        return fmt::format("element {} from member {} is {}, expected {}", k, j, recv[static_cast<size_t>(at)], expected);
    }
  }
  return "";
}

}  // namespace alloy::cli
