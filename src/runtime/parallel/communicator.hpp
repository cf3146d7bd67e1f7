// Communicator: point-to-point and collective communication between the ranks of a plan, on
// groups built from the rank map. Every call returns at once with a handle; a progress thread
// drives the transfers, so communication overlaps the caller's compute.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "spec/error.hpp"

#include "cost/profile.hpp"
#include "runtime/parallel/link_pacing.hpp"

namespace alloy {

enum class ReduceOp { ReduceOp_sum, ReduceOp_max };

// Exit status of a job ended because an operation did not finish within the timeout.
inline constexpr int kExitCommTimeout = 4;

// Completion driven by something other than the MPI progress engine (the GPU communicators: an
// event on a communication stream). A handle built from one forwards wait() and done() to it,
// which keep the handle's contract below (errors throw alloy::Error, a timeout aborts the job).
class CommCompletion {
 public:
  virtual ~CommCompletion() = default;
  virtual void wait() = 0;
  virtual bool done() = 0;
};

// Completion of one posted operation. wait() blocks until it is done and throws alloy::Error
// when the operation failed. When it does not finish within the communicator's timeout, wait()
// aborts the whole job (Communicator::abort, exit status kExitCommTimeout) with a message naming
// the operation: the peers are stuck in it too, so throwing on one rank would leave them hanging.
// Handles must not be waited on after their communicator is destroyed.
class CommHandle {
 public:
  struct State;
  CommHandle() = default;
  explicit CommHandle(std::shared_ptr<State> state) : state_(std::move(state)) {}
  explicit CommHandle(std::shared_ptr<CommCompletion> completion) : completion_(std::move(completion)) {}
  void wait() const;
  bool done() const;
  bool valid() const { return state_ != nullptr || completion_ != nullptr; }

 private:
  std::shared_ptr<State> state_;                 // MPI communicator
  std::shared_ptr<CommCompletion> completion_;   // other communicators
};

// A group of world ranks; `members` ascending. Index of a rank inside the group = its position.
struct CommGroup {
  int id = -1;                 // communicator-private handle
  std::vector<int> members;    // world ranks
  int my_index = -1;           // position of this rank in members (-1: not a member)
  int size() const { return static_cast<int>(members.size()); }
};

// One all_reduce, reduce_scatter or all_gather this rank posted while timing was on. Members
// post a group's collectives in one order, so `sequence` (the group's n-th collective on this
// communicator) names the same collective on every member. The member that posted last waited
// least: the least `seconds` over the members is the collective's own time once all had joined.
// `blocked`: this rank waited for it from (about) its call. One posted ahead of its wait (a
// prefetched ZeRO-3 gather) ran under compute, as fast as the busy cores let it, and one posted
// behind others in flight (ZeRO 1-2 re-gather every bucket at once) counts their time too:
// neither says what the collective takes when waited for.
struct CollectiveTiming {
  CollectiveOp op = CollectiveOp::CollectiveOp_all_reduce;
  int group_id = -1;  // this rank's CommGroup::id
  int64_t sequence = 0;
  int64_t bytes = 0;   // the whole buffer (every member's piece), as the profile counts it
  double seconds = 0;  // from the call to completion on this rank
  bool blocked = false;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Ranks on this host (for thread counts) and the host's name (for messages).
  virtual int local_size() const = 0;
  virtual std::string host_name() const = 0;

  // Collective over the whole world: every rank calls it with the same `ranks_of_groups`
  // (a partition of some or all world ranks into groups) and gets the group it is in, or a
  // group with my_index -1 when it is in none. Groups of one rank are allowed.
  virtual CommGroup split(const std::vector<std::vector<int>>& ranks_of_groups) = 0;
  virtual const CommGroup& world() const = 0;

  // Point to point. `data` must stay alive and unchanged until the handle is done.
  virtual CommHandle send(const void* data, int64_t bytes, int peer, int tag) = 0;
  virtual CommHandle recv(void* data, int64_t bytes, int peer, int tag) = 0;

  // Collectives over `group`; members call them in the same order. Float or double data.
  // all_reduce: data (count) in place.
  virtual CommHandle all_reduce(float* data, int64_t count, const CommGroup& group,
                                ReduceOp op = ReduceOp::ReduceOp_sum) = 0;
  virtual CommHandle all_reduce(double* data, int64_t count, const CommGroup& group,
                                ReduceOp op = ReduceOp::ReduceOp_sum) = 0;
  // data: (sum of counts); member i ends with the sum over members of its piece
  // [offset_i, offset_i + counts[i]) in place (other pieces are left unspecified).
  virtual CommHandle reduce_scatter(float* data, const std::vector<int64_t>& counts, const CommGroup& group) = 0;
  // The same with every member's values sent in bf16 (half the bytes) and summed in fp32 by the
  // piece's owner, in member order: member i ends with sum_j bf16(data_j) over its piece. The
  // MPI and single-rank communicators do; the GPU ones refuse.
  virtual CommHandle reduce_scatter_bf16(float* /*data*/, const std::vector<int64_t>& /*counts*/,
                                         const CommGroup& /*group*/) {
    throw Error("this communicator does not send gradients in bf16", {"", "gradient_communication"},
                "set gradient_communication: fp32 in the training file");
  }
  // data: (sum of counts); member i contributes its piece in place; all end with every piece.
  virtual CommHandle all_gather(float* data, const std::vector<int64_t>& counts, const CommGroup& group) = 0;
  // bytes from member `root_index` of the group to every member.
  virtual CommHandle broadcast(void* data, int64_t bytes, int root_index, const CommGroup& group) = 0;
  // Fixed-size records from every member to every member: out has group.size() * bytes.
  virtual CommHandle all_gather_bytes(const void* in, void* out, int64_t bytes, const CommGroup& group) = 0;

  // Variable counts from every member to every member: send holds send_counts[j] floats for member
  // j, one piece after another in member order; recv gets recv_counts[j] floats from member j the
  // same way. recv_counts[j] here must equal member j's send_counts[my_index]. Expert parallelism's
  // dispatch and combine. The GPU communicators take device memory here, like their collectives.
  virtual CommHandle all_to_all(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                                const std::vector<int64_t>& recv_counts, const CommGroup& group);

  // Emulated links (link_pacing.hpp): from now on every send is delivered, and every collective
  // completes, no sooner than `pacing` says its links allow. Every rank calls it with the same
  // table, between collectives, before the traffic it should pace. A communicator that cannot pace
  // refuses a table that paces any link.
  virtual void links_pace(std::shared_ptr<const LinkPacing> pacing);

  // Seconds the progress thread had at least one transfer in flight since the last call
  // (a measure of communication time that overlaps compute).
  virtual double take_busy_seconds() = 0;

  // Times the all_reduce, reduce_scatter and all_gather calls posted while on (off at first);
  // take_collective_timings hands over those completed since its last call. A communicator that
  // does not time its collectives hands over none.
  virtual void collective_timing(bool on) {}
  virtual std::vector<CollectiveTiming> take_collective_timings() { return {}; }

  // Ends every rank of the job now: prints "alloy: error on rank R (host): message" on this
  // rank's stderr and aborts the whole job with `exit_code`. Never returns.
  [[noreturn]] virtual void abort(const std::string& message, int exit_code) = 0;
};

// MPI communicator (OpenMPI). Initialises MPI on first use (MPI_THREAD_MULTIPLE, or
// SERIALIZED with every MPI call made from the progress thread) and finalises it when the
// last communicator is destroyed. `timeout_seconds`: a wait longer than this aborts the job
// with the operation, the peers that have not joined it and where they are (0: ALLOY_COMM_TIMEOUT
// from the environment, else 300 s).
std::unique_ptr<Communicator> communicator_mpi(double timeout_seconds = 0);

// The world of one rank, for a run on one device without mpirun: collectives over a group of one
// complete at once and leave the data as it is; sends and receives throw alloy::Error.
std::unique_ptr<Communicator> communicator_local();

// The timeout a communicator uses: `timeout_seconds` when positive, else ALLOY_COMM_TIMEOUT from
// the environment (seconds, at most 10^6; 0, off, inf or none: no limit), else 300 s; throws
// alloy::Error for a negative, non-finite, malformed or longer value.
double communicator_timeout_resolve(double timeout_seconds);

// True when this process was started by mpirun/srun with more than one rank.
bool communicator_launched_by_mpi();

}  // namespace alloy
