// The pooled load-balancing sums across ranks (balance_pool.hpp).
#include "runtime/parallel/balance_pool.hpp"

#include <utility>

#include <fmt/format.h>

#include "spec/error.hpp"

namespace alloy {

BalancePool::BalancePool(Communicator& comm, const CommGroup& group, bool counted, std::vector<int> forwards,
                         int64_t width)
    : comm_(comm), group_(group), counted_(counted), forwards_(std::move(forwards)), width_(width) {}

void BalancePool::step_begin() {
  // A micro-batch this rank ran no backward of was never waited for: its sums must outlive it.
  for (const MicroBatch& mb : micro_batches_)
    if (mb.reduction.valid()) mb.reduction.wait();
  micro_batches_.assign(forwards_.size(), MicroBatch{});
  for (size_t m = 0; m < forwards_.size(); ++m) {
    micro_batches_[m].sums.assign(static_cast<size_t>(width_), 0.0);
    micro_batches_[m].forwards_left = forwards_[m];
  }
  next_post_ = 0;
  post_ready();
}

void BalancePool::forward_done(int micro_batch, const std::vector<double>& sums) {
  MicroBatch& mb = micro_batches_.at(static_cast<size_t>(micro_batch));
  if (mb.forwards_left <= 0 || static_cast<int64_t>(sums.size()) != width_) {
    throw Error(fmt::format("micro-batch {}: a forward whose load-balancing sums do not fit the pooled loss's "
                            "({} forwards left, {} sums for {})",
                            micro_batch, mb.forwards_left, sums.size(), width_));
  }
  if (counted_)
    for (size_t i = 0; i < sums.size(); ++i) mb.sums[i] += sums[i];
  mb.forwards_left--;
  post_ready();
}

void BalancePool::post_ready() {
  while (next_post_ < micro_batches_.size() && micro_batches_[next_post_].forwards_left == 0) {
    MicroBatch& mb = micro_batches_[next_post_];
    mb.reduction = comm_.all_reduce(mb.sums.data(), width_, group_);
    next_post_++;
  }
}

const CommHandle& BalancePool::posted(int micro_batch) const {
  const MicroBatch& mb = micro_batches_.at(static_cast<size_t>(micro_batch));
  if (!mb.reduction.valid()) {
    throw Error(fmt::format("micro-batch {}: a backward before every forward of it on this rank had run, so its "
                            "pooled load-balancing sums are not yet posted",
                            micro_batch));
  }
  return mb.reduction;
}

const double* BalancePool::pooled(int micro_batch) const {
  return micro_batches_.at(static_cast<size_t>(micro_batch)).sums.data();
}

}  // namespace alloy
