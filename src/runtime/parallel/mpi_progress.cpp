// The MPI communicator's progress engine, handle waits and MPI's process-wide lifetime.
#include "runtime/parallel/mpi_progress.hpp"

#include <sys/prctl.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "spec/error.hpp"
#include "spec/units.hpp"
#include "util/clock.hpp"

namespace alloy {

namespace {
using Clock = std::chrono::steady_clock;

// Pause between two MPI_Testsome calls while transfers are in flight: short enough for
// latency, long enough not to take a core from the ranks that share it.
constexpr auto kPollInterval = std::chrono::microseconds(30);

// A timed collective counts as waited for from its start when its caller began waiting (or it
// completed) within this share of its time, or this many seconds, after the call. The
// allowance covers a caller preempted between the call and its wait on oversubscribed cores;
// a prefetched gather is posted a whole block's compute (milliseconds) ahead of its wait.
constexpr double kBlockedWithinShare = 0.1;
constexpr double kBlockedWithinSeconds = 1e-3;

struct MpiLifetime {
  std::mutex mutex;
  int users = 0;
  bool initialised_here = false;
};

MpiLifetime& mpi_lifetime() {
  static MpiLifetime lifetime;
  return lifetime;
}
}  // namespace

std::string CommHandle::State::describe() const {
  std::string text = fmt::format("{} of {}", kind, units_format_bytes(static_cast<double>(bytes)));
  if (peer >= 0) text += fmt::format(" {} rank {} tag {}", std::strcmp(kind, "recv") == 0 ? "from" : "to", peer, tag);
  if (members) text += fmt::format(" over ranks [{}]", fmt::join(*members, ", "));
  return text;
}

void CommHandle::wait() const {
  if (completion_) {
    completion_->wait();
    return;
  }
  if (!state_) throw Error("wait on an empty CommHandle", {}, "wait only on handles returned by a Communicator call");
  std::unique_lock lock(state_->mutex);
  Clock::time_point start = Clock::now();
  if (!state_->done && !state_->wait_started) state_->wait_started = start;
  bool finished = state_->finished.wait_for(lock, std::chrono::duration<double>(state_->timeout_seconds),
                                            [this] { return state_->done; });
  if (!finished) {
    std::string message = fmt::format(
        "timed out after {:.1f} s waiting for {}; a peer never joined it (it failed, hangs, or posts its "
        "operations in another order); if it is only slow, raise ALLOY_COMM_TIMEOUT (seconds)",
        seconds_since(start), state_->describe());
    lock.unlock();
    state_->owner->abort(message, kExitCommTimeout);
  }
  if (!state_->error.empty()) {
    throw Error(fmt::format("{} failed: {}", state_->describe(), state_->error), {},
                "check the MPI installation with `mpirun -np N alloy comm-check`");
  }
}

bool CommHandle::done() const {
  if (completion_) return completion_->done();
  if (!state_) return false;
  std::lock_guard lock(state_->mutex);
  return state_->done;
}

void mpi_acquire() {
  MpiLifetime& life = mpi_lifetime();
  std::lock_guard lock(life.mutex);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) {
    throw Error("MPI was already finalised in this process", {},
                "create one communicator per process and keep it for the whole run");
  }
  int initialised = 0;
  MPI_Initialized(&initialised);
  int provided = 0;
  if (!initialised) {
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    life.initialised_here = true;
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_SERIALIZED) {
    throw Error("this MPI library supports neither MPI_THREAD_MULTIPLE nor MPI_THREAD_SERIALIZED", {},
                "use an MPI built with thread support (OpenMPI: check `ompi_info | grep -i thread`)");
  }
  if (life.users > 0 && provided < MPI_THREAD_MULTIPLE) {
    throw Error("a second communicator needs MPI_THREAD_MULTIPLE, which this MPI does not provide", {},
                "use one communicator per process");
  }
  ++life.users;
}

void mpi_release() {
  MpiLifetime& life = mpi_lifetime();
  std::lock_guard lock(life.mutex);
  if (--life.users == 0 && life.initialised_here) MPI_Finalize();
}

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<size_t>(length));
}

void mpi_check(int code, const char* call) {
  if (code != MPI_SUCCESS) throw MpiFailure{fmt::format("{}: {}", call, mpi_error_text(code))};
}

void MpiProgress::start() {
  thread_ = std::thread([this] { loop(); });
}

void MpiProgress::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void MpiProgress::enqueue(std::shared_ptr<MpiOperation> op) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(op));
  }
  wake_.notify_one();
}

double MpiProgress::take_busy_seconds() {
  std::lock_guard lock(mutex_);
  double seconds = busy_seconds_;
  busy_seconds_ = 0;
  if (busy_) {
    seconds += seconds_since(busy_since_);
    busy_since_ = Clock::now();
  }
  return seconds;
}

void MpiProgress::busy_update(bool busy_now) {
  std::lock_guard lock(mutex_);
  if (busy_now == busy_) return;
  if (busy_now) {
    busy_since_ = Clock::now();
  } else {
    busy_seconds_ += seconds_since(busy_since_);
  }
  busy_ = busy_now;
}

std::vector<CollectiveTiming> MpiProgress::take_collective_timings() {
  std::lock_guard lock(mutex_);
  return std::exchange(timings_, {});
}

void MpiProgress::complete(MpiOperation& op) {
  if (op.state->error.empty() && op.finish) op.finish();
  if (op.state->timing && op.state->error.empty()) {
    CollectiveTiming timing = *op.state->timing;
    timing.seconds = seconds_since(op.state->posted);
    {
      std::lock_guard lock(op.state->mutex);
      const double idle = op.state->wait_started
                              ? std::chrono::duration<double>(*op.state->wait_started - op.state->posted).count()
                              : timing.seconds;
      timing.blocked = idle <= std::max(kBlockedWithinShare * timing.seconds, kBlockedWithinSeconds);
    }
    std::lock_guard lock(mutex_);
    timings_.push_back(timing);
  }
  {
    std::lock_guard lock(op.state->mutex);
    op.state->done = true;
  }
  op.state->finished.notify_all();
}

void MpiProgress::operation_start(const std::shared_ptr<MpiOperation>& op) {
  MpiPosting posting;
  try {
    op->post(posting);
  } catch (const MpiFailure& failure) {
    op->state->error = failure.message;  // the handle is not done yet, so no caller reads it
  }
  op->pending = static_cast<int>(posting.requests.size());
  if (op->pending == 0) {
    complete(*op);
    return;
  }
  for (size_t i = 0; i < posting.requests.size(); ++i) {
    requests_.push_back(posting.requests[i]);
    request_recv_bytes_.push_back(posting.recv_bytes[i]);
    request_ops_.push_back(op);
  }
}

void MpiProgress::requests_test() {
  int completed = 0;
  std::vector<int> indices(requests_.size());
  std::vector<MPI_Status> statuses(requests_.size());
  int code = MPI_Testsome(static_cast<int>(requests_.size()), requests_.data(), &completed, indices.data(),
                          statuses.data());
  if (code != MPI_SUCCESS && code != MPI_ERR_IN_STATUS) {
    owner_->abort(fmt::format("MPI_Testsome failed: {}", mpi_error_text(code)), 1);
  }
  if (completed == MPI_UNDEFINED || completed == 0) return;
  for (int j = 0; j < completed; ++j) {
    size_t i = static_cast<size_t>(indices[static_cast<size_t>(j)]);
    const MPI_Status& status = statuses[static_cast<size_t>(j)];
    MpiOperation& op = *request_ops_[i];
    if (code == MPI_ERR_IN_STATUS && status.MPI_ERROR != MPI_SUCCESS && op.state->error.empty()) {
      op.state->error = mpi_error_text(status.MPI_ERROR);
    } else if (request_recv_bytes_[i] >= 0) {
      int received = 0;
      MPI_Get_count(&status, MPI_BYTE, &received);
      if (received != request_recv_bytes_[i] && op.state->error.empty()) {
        op.state->error = fmt::format("the sender sent {} bytes, {} expected", received, request_recv_bytes_[i]);
      }
    }
    if (--op.pending == 0) complete(op);
  }
  // MPI_Testsome set completed requests to MPI_REQUEST_NULL; drop them.
  size_t kept = 0;
  for (size_t i = 0; i < requests_.size(); ++i) {
    if (requests_[i] == MPI_REQUEST_NULL) continue;
    requests_[kept] = requests_[i];
    request_recv_bytes_[kept] = request_recv_bytes_[i];
    request_ops_[kept] = std::move(request_ops_[i]);
    ++kept;
  }
  requests_.resize(kept);
  request_recv_bytes_.resize(kept);
  request_ops_.resize(kept);
}

void MpiProgress::loop() {
  // Linux stretches short sleeps by the timer slack (50 us by default); polls should be ~30 us.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
  std::optional<Clock::time_point> stop_seen;
  while (true) {
    std::deque<std::shared_ptr<MpiOperation>> ready;
    {
      std::unique_lock lock(mutex_);
      if (requests_.empty()) {
        wake_.wait(lock, [this] { return !queue_.empty() || stopping_; });
        if (queue_.empty()) break;  // stopping with nothing queued or in flight
      } else if (queue_.empty()) {
        wake_.wait_for(lock, kPollInterval, [this] { return !queue_.empty(); });
      }
      ready.swap(queue_);
      if (stopping_ && !stop_seen) stop_seen = Clock::now();
    }
    for (const auto& op : ready) operation_start(op);
    busy_update(!requests_.empty());
    if (requests_.empty()) continue;
    requests_test();
    busy_update(!requests_.empty());
    if (stop_seen && !requests_.empty() && seconds_since(*stop_seen) > timeout_seconds_) {
      owner_->abort(fmt::format("timed out after {:.1f} s finishing {} at shutdown ({} requests in flight)",
                                timeout_seconds_, request_ops_.front()->state->describe(), requests_.size()),
                    kExitCommTimeout);
    }
  }
}

}  // namespace alloy
