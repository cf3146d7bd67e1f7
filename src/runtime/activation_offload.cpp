// The activation offload engine. Arena allocations and frees happen only on the passes' thread;
// the two copy threads only copy and pace.
#include "runtime/activation_offload.hpp"

#include <algorithm>
#include <cstring>

#include "runtime/device_speed.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace {

// The buffers of a block's saved activations that may leave the device: all but the block's
// output, which the next block reads.
std::vector<float**> saved_fields(BlockActivations& a) {
  return {&a.ln1, &a.ln1_mean, &a.ln1_rstd, &a.qkv, &a.probs, &a.context,
          &a.residual1, &a.ln2, &a.ln2_mean, &a.ln2_rstd, &a.mlp_up, &a.mlp_act};
}

}  // namespace

ActivationOffload::ActivationOffload(Model& model, std::vector<bool> offloaded, int prefetch_depth, HostLink& link,
                                     Arena& host)
    : model_(model), offloaded_(std::move(offloaded)), depth_(std::max(1, prefetch_depth)), link_(link), host_(host) {
  model.activation_store = this;
  storer_ = std::thread([this] { copy_loop(false); });
  loader_ = std::thread([this] { copy_loop(true); });
}

ActivationOffload::~ActivationOffload() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  storer_.join();
  loader_.join();
  if (model_.activation_store == this) model_.activation_store = nullptr;
  for (Record& r : records_)
    for (Piece& p : r.pieces) host_.release(p.host);
}

ActivationOffload::Record* ActivationOffload::find(const ChunkPass& pass, int layer) {
  for (Record& r : records_)
    if (r.pass == &pass && r.layer == layer) return &r;
  return nullptr;
}

void ActivationOffload::wait_copied(std::unique_lock<std::mutex>& lock, const Record& record) {
  if (record.copy_done) return;
  lock.unlock();  // an emulated slow device's stretch before the wait must not hold the copies up
  wait_seconds_ += compute_wait([&] {
    lock.lock();
    changed_.wait(lock, [&] { return record.copy_done; });
  });
}

void ActivationOffload::reap(std::unique_lock<std::mutex>& /*lock*/) {
  for (Record& r : records_) {
    if (r.state != RecordState::RecordState_storing || !r.copy_done) continue;
    for (Piece& p : r.pieces) {
      model_.arena->release(p.device);
      p.device = nullptr;
      *p.field = nullptr;
    }
    r.state = RecordState::RecordState_stored;
  }
}

void ActivationOffload::saved(ChunkPass& pass, int layer) {
  if (static_cast<size_t>(layer) >= offloaded_.size() || !offloaded_[static_cast<size_t>(layer)]) return;
  std::unique_lock<std::mutex> lock(mutex_);
  reap(lock);
  // At most `depth` blocks' activations on their way out: the device window stays bounded.
  for (;;) {
    Record* oldest = nullptr;
    int storing = 0;
    for (Record& r : records_)
      if (r.state == RecordState::RecordState_storing) {
        if (oldest == nullptr) oldest = &r;
        ++storing;
      }
    if (storing < depth_) break;
    wait_copied(lock, *oldest);
    reap(lock);
  }
  Record record;
  record.pass = &pass;
  record.layer = layer;
  for (float** field : saved_fields(pass.blocks[static_cast<size_t>(layer - pass.block_begin)])) {
    if (*field == nullptr) continue;
    const auto [bytes, name] = model_.arena->allocation(*field);
    Piece piece{field, *field, nullptr, bytes, *name};
    piece.host = static_cast<float*>(host_.allocate(bytes, "offloaded activations"));
    record.pieces.push_back(std::move(piece));
  }
  if (record.pieces.empty()) return;  // full recomputation keeps nothing but the output
  records_.push_back(std::move(record));
  stores_.push_back(&records_.back());
  changed_.notify_all();
}

void ActivationOffload::issue_load(Record& record) {
  for (Piece& p : record.pieces) p.device = static_cast<float*>(model_.arena->allocate(p.bytes, p.name.c_str()));
  record.state = RecordState::RecordState_loading;
  record.copy_done = false;
  loads_.push_back(&record);
  changed_.notify_all();
}

void ActivationOffload::needed(ChunkPass& pass, int layer) {
  std::unique_lock<std::mutex> lock(mutex_);
  Record* record = find(pass, layer);
  if (record == nullptr) return;
  if (record->state == RecordState::RecordState_storing) wait_copied(lock, *record);
  reap(lock);
  if (record->state == RecordState::RecordState_stored) issue_load(*record);
  // Fetch ahead: the pass's next marked blocks below, already in host memory.
  int ahead = 0;
  for (int below = layer - 1; below >= pass.block_begin && ahead < depth_; --below) {
    Record* next = find(pass, below);
    if (next == nullptr) continue;
    if (next->state == RecordState::RecordState_stored) issue_load(*next);
    ++ahead;
  }
  wait_copied(lock, *record);
  for (Piece& p : record->pieces) {
    *p.field = p.device;
    host_.release(p.host);
  }
  records_.remove_if([&](const Record& r) { return &r == record; });
}

void ActivationOffload::dropped(ChunkPass& pass) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (Record& r : records_)
    if (r.pass == &pass) wait_copied(lock, r);
  reap(lock);
  for (Record& r : records_) {
    if (r.pass != &pass) continue;
    for (Piece& p : r.pieces) {
      if (r.state == RecordState::RecordState_loading) *p.field = p.device;  // freed with the pass
      host_.release(p.host);
    }
  }
  records_.remove_if([&](const Record& r) { return r.pass == &pass; });
}

void ActivationOffload::copy_loop(bool to_device) {
  std::deque<Record*>& queue = to_device ? loads_ : stores_;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stop_ || !queue.empty(); });
    if (stop_) return;
    Record* record = queue.front();
    queue.pop_front();
    const std::vector<Piece> pieces = record->pieces;
    lock.unlock();

    const double start = offload_clock_seconds();
    int64_t bytes = 0;
    for (const Piece& p : pieces) {
      if (to_device) {
        std::memcpy(p.device, p.host, static_cast<size_t>(p.bytes));
      } else {
        std::memcpy(p.host, p.device, static_cast<size_t>(p.bytes));
      }
      bytes += p.bytes;
    }
    const double end = link_.pace(bytes, to_device, start);

    lock.lock();
    record->copy_done = true;
    OffloadUse use;
    use.block = record->layer;
    use.backward = to_device;
    use.micro_batch = -1;
    copies_.push_back({to_device, bytes, std::max(start, link_.start_of(bytes, end)), end, use});
    changed_.notify_all();
  }
}

double ActivationOffload::take_wait_seconds() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(wait_seconds_, 0.0);
}

std::vector<OffloadCopy> ActivationOffload::take_copies() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(copies_, {});
}

}  // namespace alloy
