// The MPI communicator's progress engine, handle waits and MPI's process-wide lifetime.
#include "runtime/parallel/mpi_progress.hpp"

#include <sys/prctl.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <sstream>
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

double wall_clock_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A timed collective counts as waited for from its start when its caller began waiting (or it
// completed) within this share of its time, or this many seconds, after the call. The
// allowance covers a caller preempted between the call and its wait on oversubscribed cores;
// a prefetched gather is posted a whole block's compute (milliseconds) ahead of its wait.
constexpr double kBlockedWithinShare = 0.1;
constexpr double kBlockedWithinSeconds = 1e-3;

// Inquiries travel on a communicator of their own: a question (one int) and an answer (text).
constexpr int kInquiryAskTag = 1;
constexpr int kInquiryAnswerTag = 2;
constexpr int kInquiryAnswerBytes = 4096;
// How long a rank that timed out waits for its peers' answers, and how often an idle progress
// thread looks for a question (a question only comes after a timeout of seconds).
constexpr double kInquirySeconds = 5;
constexpr auto kInquiryPollInterval = std::chrono::milliseconds(20);

// One peer's answer: lines "group <key> <collectives posted>", "wait <operation>" and
// "last <operation>" (the last it posted).
struct PeerStatus {
  std::map<std::string, int64_t> posted;  // by the group's key, e.g. "0,2#0"
  std::string waiting;
  std::string last_posted;
};

PeerStatus peer_status_parse(const std::string& answer) {
  PeerStatus status;
  std::istringstream lines(answer);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("wait ", 0) == 0) status.waiting = line.substr(5);
    if (line.rfind("last ", 0) == 0) status.last_posted = line.substr(5);
    if (line.rfind("group ", 0) != 0) continue;
    const size_t space = line.rfind(' ');
    status.posted[line.substr(6, space - 6)] = std::strtoll(line.c_str() + space + 1, nullptr, 10);
  }
  return status;
}

// What `peer` says of itself about `state`'s operation; "" when it has joined the collective.
std::string peer_explain(const CommHandle::State& state, int peer, const std::string& answer) {
  if (answer.empty())
    return fmt::format("rank {} gave no answer within {:.0f} s (it may have died, or be stuck inside MPI)", peer,
                       kInquirySeconds);
  const PeerStatus status = peer_status_parse(answer);
  const std::string last =
      status.last_posted.empty() ? "it has posted none yet" : "the last it posted: " + status.last_posted;
  const std::string where =
      status.waiting.empty() ? fmt::format("waits for no communication (it computes, or is stuck outside it; {})", last)
                             : "is waiting for " + status.waiting;
  if (state.group_key.empty()) return fmt::format("rank {} {}", peer, where);
  const auto found = status.posted.find(state.group_key);
  const int64_t posted = found == status.posted.end() ? 0 : found->second;
  if (posted > state.sequence) return "";
  return fmt::format("rank {} has not joined (it has posted {} of this group's collectives; this one is number {}) and {}",
                     peer, posted, state.sequence + 1, where);
}

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

std::string CommHandle::State::timeout_explain(int rank, double waited_seconds) const {
  std::vector<int> peers;
  if (peer >= 0) peers.push_back(peer);
  if (members)
    for (int m : *members)
      if (m != rank) peers.push_back(m);
  const std::vector<std::string> answers = progress ? progress->peers_ask(peers, kInquirySeconds)
                                                    : std::vector<std::string>(peers.size());
  std::vector<std::string> missing;
  for (size_t i = 0; i < peers.size(); ++i) {
    std::string text = peer_explain(*this, peers[i], answers[i]);
    if (!text.empty()) missing.push_back(std::move(text));
  }
  if (missing.empty()) missing.push_back("every peer has posted it, and the transfer has not finished");
  return fmt::format("timed out after {:.1f} s waiting for {} on rank {}: {}; if a peer is only slow, raise "
                     "ALLOY_COMM_TIMEOUT (seconds)",
                     waited_seconds, describe(), rank, fmt::join(missing, "; "));
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
  const bool announce = !state_->done && state_->progress;
  if (announce) state_->progress->waiting_set(state_->describe());
  const auto done = [this] { return state_->done; };
  bool finished = true;
  if (std::isinf(state_->timeout_seconds)) state_->finished.wait(lock, done);
  else finished = state_->finished.wait_for(lock, std::chrono::duration<double>(state_->timeout_seconds), done);
  if (!finished) {
    lock.unlock();
    const double waited_seconds = seconds_since(start);
    state_->owner->abort(state_->timeout_explain(state_->owner->rank(), waited_seconds), kExitCommTimeout);
  }
  if (announce) state_->progress->waiting_set("");
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

void MpiProgress::requests_done(const std::shared_ptr<MpiOperation>& op) {
  if (op->hold_seconds <= 0 || !op->state->error.empty()) {
    complete(*op);
    return;
  }
  // Collectives of one group follow each other on its links: one starts when the last is through.
  const Clock::time_point now = Clock::now();
  Clock::time_point& free = hold_free_[op->hold_key];
  const Clock::time_point start = std::max(op->join_comm != MPI_COMM_NULL ? last_join(*op, now) : now, free);
  const Clock::time_point through =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(op->hold_seconds));
  free = std::max(through, now);
  held_.emplace_back(through, op);
}

Clock::time_point MpiProgress::last_join(const MpiOperation& op, Clock::time_point now) {
  // join_seconds are on the wall clock, which every member reads alike; the hold is timed on the
  // steady clock. No later than now: MPI completed the collective, so every member had joined.
  const double ago = std::max(0.0, wall_clock_seconds() - op.join_seconds[1]);
  return now - std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(ago));
}

void MpiProgress::emulated_links_advance() {
  if (!emulated_links_busy()) return;
  const Clock::time_point now = Clock::now();
  std::vector<std::shared_ptr<MpiOperation>> due;
  std::erase_if(deferred_, [&](const std::shared_ptr<MpiOperation>& op) {
    if (*op->post_at > now) return false;
    due.push_back(op);
    return true;
  });
  for (const auto& op : due) operation_start(op);
  std::vector<std::shared_ptr<MpiOperation>> released;
  std::erase_if(held_, [&](const auto& entry) {
    if (entry.first > now) return false;
    released.push_back(entry.second);
    return true;
  });
  for (const auto& op : released) complete(*op);
}

Clock::time_point MpiProgress::emulated_links_next() const {
  Clock::time_point next = Clock::time_point::max();
  for (const auto& op : deferred_) next = std::min(next, *op->post_at);
  for (const auto& entry : held_) next = std::min(next, entry.first);
  return next;
}

void MpiProgress::operation_start(const std::shared_ptr<MpiOperation>& op) {
  if (op->post_at && *op->post_at > Clock::now()) {
    deferred_.push_back(op);
    return;
  }
  if (op->state->owner != nullptr) last_started_ = op->state;  // inquiries have no owner
  MpiPosting posting;
  try {
    if (op->join_comm != MPI_COMM_NULL) {
      op->join_seconds[0] = wall_clock_seconds();
      MPI_Request request;
      mpi_check(MPI_Iallreduce(&op->join_seconds[0], &op->join_seconds[1], 1, MPI_DOUBLE, MPI_MAX, op->join_comm, &request),
                "MPI_Iallreduce");
      posting.add(request);
    }
    op->post(posting);
  } catch (const MpiFailure& failure) {
    op->state->error = failure.message;  // the handle is not done yet, so no caller reads it
  }
  op->pending = static_cast<int>(posting.requests.size());
  if (op->pending == 0) {
    requests_done(op);
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
    if (--op.pending == 0) requests_done(request_ops_[i]);
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

void MpiProgress::inquiries_answer(MPI_Comm comm, std::function<std::string()> status) {
  inquiry_comm_ = comm;
  status_ = std::move(status);
}

void MpiProgress::waiting_set(std::string what) {
  std::lock_guard lock(mutex_);
  waiting_ = std::move(what);
}

std::string MpiProgress::waiting() {
  std::lock_guard lock(mutex_);
  return waiting_;
}

void MpiProgress::inquiries_test() {
  if (inquiry_comm_ == MPI_COMM_NULL) return;
  if (inquiry_recv_ == MPI_REQUEST_NULL)
    MPI_Irecv(&inquiry_ask_, 1, MPI_INT, MPI_ANY_SOURCE, kInquiryAskTag, inquiry_comm_, &inquiry_recv_);
  int arrived = 0;
  MPI_Status status;
  MPI_Test(&inquiry_recv_, &arrived, &status);  // sets the request to null once it arrived
  if (arrived) {
    std::string text = status_();
    if (last_started_) text += "last " + last_started_->describe() + "\n";
    auto answer = std::make_shared<std::string>(text.substr(0, kInquiryAnswerBytes - 1));
    MPI_Request send = MPI_REQUEST_NULL;
    MPI_Isend(answer->c_str(), static_cast<int>(answer->size()) + 1, MPI_CHAR, status.MPI_SOURCE, kInquiryAnswerTag,
              inquiry_comm_, &send);
    answers_.emplace_back(send, std::move(answer));
  }
  std::erase_if(answers_, [](auto& a) {
    int sent = 0;
    MPI_Test(&a.first, &sent, MPI_STATUS_IGNORE);
    return sent != 0;
  });
}

void MpiProgress::inquiries_end() {
  if (inquiry_comm_ == MPI_COMM_NULL) return;
  if (inquiry_recv_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&inquiry_recv_);
    MPI_Wait(&inquiry_recv_, MPI_STATUS_IGNORE);
  }
  for (auto& [send, answer] : answers_) MPI_Wait(&send, MPI_STATUS_IGNORE);
  answers_.clear();
}

std::vector<std::string> MpiProgress::peers_ask(const std::vector<int>& peers, double seconds) {
  std::vector<std::string> answers(peers.size());
  if (inquiry_comm_ == MPI_COMM_NULL) return answers;
  struct Asked {
    std::shared_ptr<CommHandle::State> state = std::make_shared<CommHandle::State>();
    std::shared_ptr<std::vector<char>> answer = std::make_shared<std::vector<char>>(kInquiryAnswerBytes, '\0');
  };
  static const int kQuestion = 0;
  std::vector<Asked> asked(peers.size());
  for (size_t i = 0; i < peers.size(); ++i) {
    auto op = std::make_shared<MpiOperation>();
    op->state = asked[i].state;
    op->post = [this, peer = peers[i], answer = asked[i].answer](MpiPosting& posting) {
      MPI_Request request = MPI_REQUEST_NULL;
      mpi_check(MPI_Isend(&kQuestion, 1, MPI_INT, peer, kInquiryAskTag, inquiry_comm_, &request), "MPI_Isend");
      posting.add(request);
      mpi_check(MPI_Irecv(answer->data(), kInquiryAnswerBytes, MPI_CHAR, peer, kInquiryAnswerTag, inquiry_comm_, &request),
                "MPI_Irecv");
      posting.add(request);
    };
    enqueue(std::move(op));
  }
  const Clock::time_point deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                        std::chrono::duration<double>(seconds));
  for (size_t i = 0; i < peers.size(); ++i) {
    std::unique_lock lock(asked[i].state->mutex);
    if (!asked[i].state->finished.wait_until(lock, deadline, [&] { return asked[i].state->done; })) continue;
    if (asked[i].state->error.empty()) answers[i] = std::string(asked[i].answer->data());
  }
  return answers;
}

void MpiProgress::loop() {
  // Linux stretches short sleeps by the timer slack (50 us by default); polls should be ~30 us.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
  std::optional<Clock::time_point> stop_seen;
  while (true) {
    std::deque<std::shared_ptr<MpiOperation>> ready;
    {
      std::unique_lock lock(mutex_);
      if (requests_.empty() && !emulated_links_busy()) {
        const auto woken = [this] { return !queue_.empty() || stopping_; };
        if (inquiry_comm_ == MPI_COMM_NULL) wake_.wait(lock, woken);
        else wake_.wait_for(lock, kInquiryPollInterval, woken);
        if (queue_.empty() && stopping_) break;  // stopping with nothing queued or in flight
      } else if (queue_.empty()) {
        // Nothing for MPI to progress: sleep until an emulated link's next event (or an inquiry).
        const Clock::time_point until = requests_.empty()
                                            ? std::min(emulated_links_next(), Clock::now() + kInquiryPollInterval)
                                            : Clock::now() + kPollInterval;
        wake_.wait_until(lock, until, [this] { return !queue_.empty(); });
      }
      ready.swap(queue_);
      if (stopping_ && !stop_seen) stop_seen = Clock::now();
    }
    for (const auto& op : ready) operation_start(op);
    emulated_links_advance();
    inquiries_test();
    busy_update(!requests_.empty() || emulated_links_busy());
    if (requests_.empty()) continue;
    requests_test();
    busy_update(!requests_.empty() || emulated_links_busy());
    if (stop_seen && !requests_.empty() && seconds_since(*stop_seen) > timeout_seconds_) {
      owner_->abort(fmt::format("timed out after {:.1f} s finishing {} at shutdown ({} requests in flight)",
                                timeout_seconds_, request_ops_.front()->state->describe(), requests_.size()),
                    kExitCommTimeout);
    }
  }
  inquiries_end();
}

}  // namespace alloy
