// Private to the MPI communicator: the handle state, MPI's process-wide lifetime, and the
// progress engine, a thread that makes every MPI call after start-up. Callers queue operations;
// the thread posts them in FIFO order (so every member posts its collectives in the same order)
// and polls them with MPI_Testsome, sleeping when nothing is in flight.
#pragma once

#include <mpi.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/parallel/communicator.hpp"

namespace alloy {

inline constexpr double kCommDefaultTimeoutSeconds = 300;
// ALLOY_COMM_TIMEOUT=off: waits have no limit.
inline constexpr double kCommNoTimeout = std::numeric_limits<double>::infinity();

class MpiProgress;

// What a wait needs: completion, an error, and enough to name the operation on a timeout.
struct CommHandle::State {
  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;
  std::string error;  // MPI's message when the operation failed
  Communicator* owner = nullptr;
  double timeout_seconds = kCommDefaultTimeoutSeconds;
  const char* kind = "";
  int64_t bytes = 0;
  int peer = -1;  // point to point only
  int tag = -1;
  std::shared_ptr<const std::vector<int>> members;  // collectives only
  int64_t sequence = -1;  // counted collectives: their number in the group's order, from 0
  std::string group_key;  // counted collectives: the group as every member names it ("0,2#1")
  MpiProgress* progress = nullptr;  // asks the peers where they are when a wait times out
  // Set for a collective posted while timing was on: its timing, less the seconds.
  std::optional<CollectiveTiming> timing;
  std::chrono::steady_clock::time_point posted;  // when the caller called it (timed collectives only)
  std::optional<std::chrono::steady_clock::time_point> wait_started;  // a caller's first wait, if before completion

  // "all_reduce (sum) of 4.0 MiB over ranks [0, 1]", "recv of 64 B from rank 3 tag 17".
  std::string describe() const;
  // Why a wait of `waited_seconds` timed out on rank `rank`: the operation, and each peer that
  // has not joined it with where that peer is, as far as the peers answer.
  std::string timeout_explain(int rank, double waited_seconds) const;
};

// MPI is initialised once per process (MPI_THREAD_MULTIPLE requested, SERIALIZED accepted);
// the last release finalises it when mpi_acquire initialised it.
void mpi_acquire();
void mpi_release();

std::string mpi_error_text(int code);

// Posting runs on the progress thread; a failed MPI call throws this and fails the handle.
struct MpiFailure {
  std::string message;
};
void mpi_check(int code, const char* call);

// Requests one operation posted; `recv_bytes` is the size a receive must deliver (-1: any).
struct MpiPosting {
  std::vector<MPI_Request> requests;
  std::vector<int> recv_bytes;
  void add(MPI_Request request, int expected_recv_bytes = -1) {
    requests.push_back(request);
    recv_bytes.push_back(expected_recv_bytes);
  }
};

struct MpiOperation {
  std::shared_ptr<CommHandle::State> state;
  std::function<void(MpiPosting&)> post;  // on the progress thread: issue the MPI calls
  std::function<void()> finish;           // on the progress thread once all requests completed
  int pending = 0;
  // Emulated links (link_pacing.hpp): a send is posted no earlier than `post_at`, when its last
  // byte would arrive on the paced link. A collective takes `hold_seconds` from when its last
  // member joined it (or the group's previous held collective was through; `hold_key`: the
  // group's key), and longer only when MPI itself takes longer: the copies on this host stand for
  // the link's transfer, they do not add to it. The members learn when the last one joined from
  // a small all-reduce (max) of the wall-clock times they posted it at, on `join_comm` just
  // before the collective; `join_seconds` holds this rank's time, then the latest.
  std::optional<std::chrono::steady_clock::time_point> post_at;
  double hold_seconds = 0;
  std::string hold_key;
  MPI_Comm join_comm = MPI_COMM_NULL;
  std::array<double, 2> join_seconds{};
};

class MpiProgress {
 public:
  // `owner` ends the job when MPI itself fails or a drain at shutdown exceeds the timeout.
  MpiProgress(Communicator* owner, double timeout_seconds) : owner_(owner), timeout_seconds_(timeout_seconds) {}
  ~MpiProgress() { stop(); }
  MpiProgress(const MpiProgress&) = delete;
  MpiProgress& operator=(const MpiProgress&) = delete;

  void start();
  // Finishes everything queued or in flight, then joins the thread.
  void stop();
  void enqueue(std::shared_ptr<MpiOperation> op);
  double take_busy_seconds();
  std::vector<CollectiveTiming> take_collective_timings();

  // Before start(): answer peers' inquiries on `comm` (a communicator of their own) with
  // `status()`, from this thread, so that a rank whose caller is stuck still says where it is.
  void inquiries_answer(MPI_Comm comm, std::function<std::string()> status);
  // What each of `peers` says of itself; "" for a peer that gave no answer within `seconds`.
  std::vector<std::string> peers_ask(const std::vector<int>& peers, double seconds);
  // What this rank's caller waits for now ("" for nothing), for its answers.
  void waiting_set(std::string what);
  std::string waiting();

 private:
  void loop();
  void inquiries_test();  // answers an inquiry that arrived, re-arms, retires sent answers
  void inquiries_end();
  void operation_start(const std::shared_ptr<MpiOperation>& op);
  void requests_test();
  void busy_update(bool busy_now);
  void complete(MpiOperation& op);  // marks it done; keeps its timing if it has one
  // MPI finished `op`: completes it now, or holds it for its emulated link.
  void requests_done(const std::shared_ptr<MpiOperation>& op);
  // When the last member joined a held collective, on the steady clock (MpiOperation::join_seconds).
  static std::chrono::steady_clock::time_point last_join(const MpiOperation& op, std::chrono::steady_clock::time_point now);
  void emulated_links_advance();  // posts deferred sends and completes held operations now due
  bool emulated_links_busy() const { return !deferred_.empty() || !held_.empty(); }
  std::chrono::steady_clock::time_point emulated_links_next() const;  // the earliest of those

  Communicator* owner_;
  double timeout_seconds_;

  // Shared between callers and the thread.
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<MpiOperation>> queue_;
  bool stopping_ = false;
  double busy_seconds_ = 0;
  bool busy_ = false;
  std::chrono::steady_clock::time_point busy_since_;
  std::vector<CollectiveTiming> timings_;  // completed since take_collective_timings
  std::string waiting_;

  // Inquiries: set before start(), then the thread's alone.
  MPI_Comm inquiry_comm_ = MPI_COMM_NULL;
  std::function<std::string()> status_;
  MPI_Request inquiry_recv_ = MPI_REQUEST_NULL;
  int inquiry_ask_ = 0;
  std::vector<std::pair<MPI_Request, std::shared_ptr<std::string>>> answers_;  // sends in flight
  std::shared_ptr<CommHandle::State> last_started_;  // the caller's last operation posted

  // The thread only: requests in flight, and for each its operation and expected receive size.
  std::vector<MPI_Request> requests_;
  std::vector<int> request_recv_bytes_;
  std::vector<std::shared_ptr<MpiOperation>> request_ops_;
  std::vector<std::shared_ptr<MpiOperation>> deferred_;  // sends waiting for their post_at, in order
  std::vector<std::pair<std::chrono::steady_clock::time_point, std::shared_ptr<MpiOperation>>> held_;
  std::map<std::string, std::chrono::steady_clock::time_point> hold_free_;  // by hold_key
  std::thread thread_;
};

}  // namespace alloy
