// Expert parallelism and the MoE blocks' sums across data-parallel replicas on a communicator:
// the model's MoeExchange over a rank's groups, and the groups themselves (plan_ep_group,
// plan_expert_dp_group).
#pragma once

#include <memory>
#include <vector>

#include "plan/plan.hpp"
#include "runtime/model.hpp"
#include "runtime/parallel/communicator.hpp"

namespace alloy {

// Every partition of the world into the groups `group_of(plan, rank)` gives (each rank's group,
// once), for Communicator::split.
std::vector<std::vector<int>> expert_groups_partition(const Plan& plan,
                                                      std::vector<int> (*group_of)(const Plan&, int));

// The MoE blocks' collectives of one rank: the exchange of token rows (the backend's memory) within
// `members` (its expert-parallel group) on `data`, and host values on `control`: sums over
// `host_replicas` (the stage's data-parallel group) and counts within `host_members` (the same
// members). Blocking: the block's next step needs the result.
class CommMoeExchange final : public MoeExchange {
 public:
  CommMoeExchange(Communicator& data, const CommGroup& members, Communicator& control, const CommGroup& host_replicas,
                  const CommGroup& host_members)
      : data_(data), members_(members), control_(control), host_replicas_(host_replicas), host_members_(host_members) {}
  void replicas_sum(double* data, int64_t count) override;
  void members_gather(const int64_t* mine, int64_t* all, int64_t count) override;
  void members_exchange(const float* send, const std::vector<int64_t>& send_rows, float* recv,
                        const std::vector<int64_t>& recv_rows, int64_t width) override;
  // Seconds blocked in these collectives since the last call.
  double take_wait_seconds();

 private:
  void wait_on(const CommHandle& handle);

  Communicator& data_;
  CommGroup members_;
  Communicator& control_;
  CommGroup host_replicas_;
  CommGroup host_members_;
  double wait_seconds_ = 0;
};

}  // namespace alloy
