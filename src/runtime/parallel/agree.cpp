// Agreement on errors: every rank's problem (or none) gathered on every rank.
#include "runtime/parallel/agree.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include <fmt/format.h>

namespace alloy {

RankFinding dist_first_finding(Communicator& comm, const std::string& found) {
  constexpr int64_t kRecordBytes = 2048;
  std::vector<char> mine(kRecordBytes, 0);
  std::memcpy(mine.data(), found.data(), std::min<size_t>(found.size(), kRecordBytes - 1));
  std::vector<char> all(static_cast<size_t>(kRecordBytes * comm.world_size()));
  comm.all_gather_bytes(mine.data(), all.data(), kRecordBytes, comm.world()).wait();
  for (int r = 0; r < comm.world_size(); ++r) {
    const char* text = all.data() + static_cast<int64_t>(r) * kRecordBytes;
    if (text[0] != '\0') return {r, std::string(text)};
  }
  return {};
}

void dist_agree(Communicator& comm, const std::string& problem) {
  const RankFinding first = dist_first_finding(comm, problem);
  if (first.rank >= 0) throw AgreedError(fmt::format("rank {} of {}: {}", first.rank, comm.world_size(), first.text));
}

void dist_agree_on(Communicator& comm, const std::function<void()>& check) {
  if (comm.world_size() == 1) {  // no peer to tell: the error keeps its file and field
    check();
    return;
  }
  std::string problem;
  try {
    check();
  } catch (const AgreedError&) {
    throw;
  } catch (const Error& e) {
    problem = e.format();
  }
  dist_agree(comm, problem);
}

}  // namespace alloy
