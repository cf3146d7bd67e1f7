// The pooled load-balancing loss of an MoE model across ranks: one f and one P per micro-batch
// over every MoE block, whichever stage holds it, and every replica's tokens.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/parallel/communicator.hpp"

namespace alloy {

// Each rank adds its forwards' balance sums of a micro-batch (ChunkPass::balance_sums); after its
// last forward of the micro-batch it posts their all-reduce over every rank of the plan, and its
// backwards of the micro-batch wait for it. Every rank posts the micro-batches in ascending order
// (so the all-reduces pair up) and each one before any backward of it can run (every forward of a
// micro-batch, on every stage, precedes its backwards): posting never waits for a peer.
class BalancePool {
 public:
  // group: every rank of the plan; counted: this rank's sums are added (one tensor-parallel
  // position, so that each token counts once); forwards: this rank's forward ops per micro-batch;
  // width: 2 E + 1 (picks and probability sums per expert, rows routed).
  BalancePool(Communicator& comm, const CommGroup& group, bool counted, std::vector<int> forwards, int64_t width);

  // Starts a step: forgets the last step's micro-batches (waiting for any all-reduce still in
  // flight) and posts those this rank has no forward of.
  void step_begin();
  // After a forward of `micro_batch`: adds its pass's sums (width).
  void forward_done(int micro_batch, const std::vector<double>& sums);
  // The all-reduce of `micro_batch`'s sums, posted once this rank's forwards of it are done
  // (throws alloy::Error before); its sums once the handle is done.
  const CommHandle& posted(int micro_batch) const;
  const double* pooled(int micro_batch) const;

 private:
  struct MicroBatch {
    std::vector<double> sums;
    int forwards_left = 0;
    CommHandle reduction;  // valid once posted
  };
  // Posts the all-reduces of the micro-batches whose forwards are done, in ascending order.
  void post_ready();

  Communicator& comm_;
  CommGroup group_;
  bool counted_ = false;
  std::vector<int> forwards_;
  int64_t width_ = 0;
  std::vector<MicroBatch> micro_batches_;
  size_t next_post_ = 0;
};

}  // namespace alloy
