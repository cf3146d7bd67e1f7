// The MoE blocks' collectives on a communicator (expert_parallel.hpp).
#include "runtime/parallel/expert_parallel.hpp"

#include <set>

#include "runtime/device_speed.hpp"

namespace alloy {

std::vector<std::vector<int>> expert_groups_partition(const Plan& plan,
                                                      std::vector<int> (*group_of)(const Plan&, int)) {
  std::set<std::vector<int>> groups;
  for (int rank = 0; rank < plan.num_used_devices(); ++rank) groups.insert(group_of(plan, rank));
  return {groups.begin(), groups.end()};
}

void CommMoeExchange::wait_on(const CommHandle& handle) {
  wait_seconds_ += compute_wait([&] { handle.wait(); });  // not stretched as a slow device's compute
}

double CommMoeExchange::take_wait_seconds() {
  const double seconds = wait_seconds_;
  wait_seconds_ = 0;
  return seconds;
}

void CommMoeExchange::replicas_sum(double* data, int64_t count) {
  wait_on(control_.all_reduce(data, count, host_replicas_));
}

void CommMoeExchange::members_gather(const int64_t* mine, int64_t* all, int64_t count) {
  wait_on(control_.all_gather_bytes(mine, all, count * static_cast<int64_t>(sizeof(int64_t)), host_members_));
}

void CommMoeExchange::members_exchange(const float* send, const std::vector<int64_t>& send_rows, float* recv,
                                       const std::vector<int64_t>& recv_rows, int64_t width) {
  std::vector<int64_t> send_floats, recv_floats;
  for (int64_t rows : send_rows) send_floats.push_back(rows * width);
  for (int64_t rows : recv_rows) recv_floats.push_back(rows * width);
  wait_on(data_.all_to_all(send, send_floats, recv, recv_floats, members_));
}

}  // namespace alloy
