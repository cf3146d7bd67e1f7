// Fixed-size records of every rank on rank 0, one source rank at a time: every rank calls it
// with the same `source`; rank 0 gets the source's records, the others nothing.
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "runtime/parallel/communicator.hpp"

namespace alloy {

inline constexpr int kGatherRecordsTag = 7;  // the step's transfers are all done when gathers run

template <typename T>
std::vector<T> gather_records_on_root(Communicator& comm, const std::vector<T>& mine, int source) {
  static_assert(std::is_trivially_copyable_v<T>, "records travel as bytes");
  std::vector<T> records;
  if (comm.rank() == source) records = mine;
  int64_t count = static_cast<int64_t>(mine.size());
  comm.broadcast(&count, sizeof(count), source, comm.world()).wait();
  if (source == 0) return records;
  if (comm.rank() == source) {
    comm.send(mine.data(), count * static_cast<int64_t>(sizeof(T)), 0, kGatherRecordsTag).wait();
  } else if (comm.rank() == 0) {
    records.resize(static_cast<size_t>(count));
    comm.recv(records.data(), count * static_cast<int64_t>(sizeof(T)), source, kGatherRecordsTag).wait();
  }
  return records;
}

}  // namespace alloy
