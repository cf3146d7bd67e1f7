// The offload engine: a fetch thread fills device slots with offloaded blocks' weights (and, for
// a backward that is not the block's first of the step, its accumulated gradients) in the order
// the passes will use them, at most `depth` uses ahead; a write-back thread returns gradients to
// host memory after each backward use. The passes wait only when a slot is not ready yet.
#include "runtime/offload.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "runtime/device_speed.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace {

size_t offloaded_block_bytes(const std::vector<const ParameterSegment*>& host) {
  size_t floats = 0;
  for (const ParameterSegment* s : host) floats += static_cast<size_t>(s->count);
  return floats * sizeof(float);
}

}  // namespace

double offload_clock_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double HostLink::pace(int64_t bytes, bool to_device, double start_seconds) {
  if (bytes_per_second_ <= 0) return offload_clock_seconds();
  double end = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    double& busy = busy_until_[to_device ? 1 : 0];
    end = std::max(busy, start_seconds) + static_cast<double>(bytes) / bytes_per_second_;
    busy = end;
  }
  const double left = end - offload_clock_seconds();
  if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(left));
  return end;
}

std::vector<OffloadUse> offload_uses_from_schedule(const RankSchedule& schedule, const std::vector<bool>& offloaded) {
  std::vector<OffloadUse> uses;
  std::vector<bool> seen_backward(offloaded.size(), false);
  const auto is_offloaded = [&](int b) { return b >= 0 && static_cast<size_t>(b) < offloaded.size() && offloaded[static_cast<size_t>(b)]; };
  for (size_t i = 0; i < schedule.ops.size(); ++i) {
    const ScheduleOp& op = schedule.ops[i];
    const bool forward = op.kind == OpKind::OpKind_forward;
    if (!forward && op.kind != OpKind::OpKind_backward) continue;
    for (int k = 0; k < op.block_end - op.block_begin; ++k) {
      const int b = forward ? op.block_begin + k : op.block_end - 1 - k;
      if (!is_offloaded(b)) continue;
      OffloadUse use{b, !forward, false, static_cast<int>(i), op.micro_batch, op.chunk};
      if (!forward) {
        use.first_backward = !seen_backward[static_cast<size_t>(b)];
        seen_backward[static_cast<size_t>(b)] = true;
      }
      uses.push_back(use);
    }
  }
  return uses;
}

LayerOffload::LayerOffload(Model& model, std::vector<OffloadUse> uses, int prefetch_depth, HostLink& link)
    : model_(model),
      uses_(std::move(uses)),
      depth_(std::max(1, prefetch_depth)),
      link_(link),
      weight_slots_(model_weight_slots(model)),
      gradient_slots_(model_gradient_slots(model)) {
  block_segments_.resize(static_cast<size_t>(model.spec.num_layers));
  for (const ParameterSegment& s : model.segments)
    if (s.host_block >= 0) block_segments_[static_cast<size_t>(s.host_block)].push_back(&s);
  int64_t block_floats = 0;
  int blocks = 0;
  for (const std::vector<const ParameterSegment*>& segments : block_segments_) {
    if (segments.empty()) continue;
    int64_t floats = 0;
    for (const ParameterSegment* s : segments) floats += s->count;
    block_floats = std::max(block_floats, floats);
    ++blocks;
  }
  const int count = std::min(depth_ + 1, blocks);
  if (count > 0) slot_memory_ = model.arena->allocate_floats(2 * block_floats * count, "offload window");
  for (int k = 0; k < count; ++k) {
    slots_.push_back({slot_memory_ + 2 * block_floats * k, slot_memory_ + 2 * block_floats * k + block_floats});
    free_slots_.push_back(k);
  }
  pending_write_backs_.assign(static_cast<size_t>(model.spec.num_layers), 0);
  states_.assign(uses_.size(), UseState::UseState_done);
  use_slot_.assign(uses_.size(), -1);
  cursor_ = next_fetch_ = uses_.size();
  model.parameter_source = this;
  fetcher_ = std::thread([this] { fetch_loop(); });
  writer_ = std::thread([this] { write_back_loop(); });
}

LayerOffload::~LayerOffload() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  fetcher_.join();
  writer_.join();
  if (model_.parameter_source == this) model_.parameter_source = nullptr;
  model_.arena->release(slot_memory_);
}

const std::vector<const ParameterSegment*>& LayerOffload::host_segments(int block) const {
  static const std::vector<const ParameterSegment*> none;
  if (block < 0 || static_cast<size_t>(block) >= block_segments_.size()) return none;
  return block_segments_[static_cast<size_t>(block)];
}

// The block's weights (or gradients) from host memory into a slot, segment after segment.
void LayerOffload::copy_to_slot(float* slot, const std::vector<const ParameterSegment*>& host, bool gradients) const {
  for (const ParameterSegment* s : host) {
    std::memcpy(slot, gradients ? s->grads : s->params, static_cast<size_t>(s->count) * sizeof(float));
    slot += s->count;
  }
}

void LayerOffload::step_begin() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::fill(states_.begin(), states_.end(), UseState::UseState_waiting);
  cursor_ = next_fetch_ = 0;
  running_ = true;
  changed_.notify_all();
}

void LayerOffload::step_end() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (cursor_ != uses_.size()) {
    throw Error(fmt::format("offload: the step ended after {} of the {} planned uses of offloaded blocks", cursor_,
                            uses_.size()));
  }
  changed_.wait(lock, [&] { return write_backs_.empty() && free_slots_.size() == slots_.size(); });
  running_ = false;
}

void LayerOffload::wait_gradients_home(int block_begin, int block_end) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] {
    for (int b = std::max(0, block_begin); b < block_end && static_cast<size_t>(b) < pending_write_backs_.size(); ++b)
      if (pending_write_backs_[static_cast<size_t>(b)] > 0) return false;
    return true;
  });
}

bool LayerOffload::can_fetch() const {
  if (!running_ || next_fetch_ >= uses_.size() || next_fetch_ > cursor_ + static_cast<size_t>(depth_)) return false;
  if (free_slots_.empty()) return false;
  const OffloadUse& use = uses_[next_fetch_];
  // Accumulated gradients are read back only once the previous write-back of the block landed.
  return !use.backward || use.first_backward || pending_write_backs_[static_cast<size_t>(use.block)] == 0;
}

void LayerOffload::fetch_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stop_ || can_fetch(); });
    if (stop_) return;
    const size_t i = next_fetch_++;
    const int slot = free_slots_.back();
    free_slots_.pop_back();
    use_slot_[i] = slot;
    states_[i] = UseState::UseState_fetching;
    const OffloadUse use = uses_[i];
    lock.unlock();

    const std::vector<const ParameterSegment*>& host = host_segments(use.block);
    const size_t bytes = offloaded_block_bytes(host);
    const double start = offload_clock_seconds();
    copy_to_slot(slots_[static_cast<size_t>(slot)].weights, host, false);
    int64_t moved = static_cast<int64_t>(bytes);
    if (use.backward && use.first_backward) {
      std::memset(slots_[static_cast<size_t>(slot)].gradients, 0, bytes);
    } else if (use.backward) {
      copy_to_slot(slots_[static_cast<size_t>(slot)].gradients, host, true);
      moved += static_cast<int64_t>(bytes);
    }
    const double end = link_.pace(moved, true, start);

    lock.lock();
    states_[i] = UseState::UseState_ready;
    copies_.push_back({true, moved, std::max(start, link_.start_of(moved, end)), end, use});
    changed_.notify_all();
  }
}

void LayerOffload::write_back_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stop_ || !write_backs_.empty(); });
    if (stop_) return;
    const size_t i = write_backs_.front();
    const OffloadUse use = uses_[i];
    const int slot = use_slot_[i];
    lock.unlock();

    const std::vector<const ParameterSegment*>& host = host_segments(use.block);
    const size_t bytes = offloaded_block_bytes(host);
    const double start = offload_clock_seconds();
    const float* from = slots_[static_cast<size_t>(slot)].gradients;
    for (const ParameterSegment* s : host) {
      std::memcpy(s->grads, from, static_cast<size_t>(s->count) * sizeof(float));
      from += s->count;
    }
    const double end = link_.pace(static_cast<int64_t>(bytes), false, start);

    lock.lock();
    write_backs_.pop_front();
    pending_write_backs_[static_cast<size_t>(use.block)]--;
    states_[i] = UseState::UseState_done;
    use_slot_[i] = -1;
    free_slots_.push_back(slot);
    copies_.push_back({false, static_cast<int64_t>(bytes), std::max(start, link_.start_of(static_cast<int64_t>(bytes), end)), end, use});
    changed_.notify_all();
  }
}

void LayerOffload::bind(int block, const Slot* slot) {
  int64_t packed = 0;  // where the segment starts in the slot
  for (const ParameterSegment* host : host_segments(block)) {
    for (size_t k = 0; k < model_.views.size(); ++k) {
      const TensorView& view = model_.views[k];
      if (view.offset < host->offset || view.offset >= host->offset + host->count) continue;
      const int64_t at = packed + view.offset - host->offset;
      if (weight_slots_[k] != nullptr) *weight_slots_[k] = slot == nullptr ? nullptr : slot->weights + at;
      if (gradient_slots_[k] != nullptr) *gradient_slots_[k] = slot == nullptr ? nullptr : slot->gradients + at;
    }
    packed += host->count;
  }
}

void LayerOffload::acquire(int unit, bool backward) {
  if (host_segments(unit).empty()) return;
  std::unique_lock<std::mutex> lock(mutex_);
  if (cursor_ >= uses_.size() || uses_[cursor_].block != unit || uses_[cursor_].backward != backward) {
    throw Error(fmt::format("offload: the {} of block {} is not the next planned use of an offloaded block", backward ? "backward" : "forward", unit),
                {}, "run the passes in the order of the rank's schedule");
  }
  const size_t i = cursor_;
  lock.unlock();  // an emulated slow device's stretch before the wait must not hold the copies up
  wait_seconds_ += compute_wait([&] {
    lock.lock();
    changed_.wait(lock, [&] { return states_[i] == UseState::UseState_ready; });
  });
  states_[i] = UseState::UseState_in_use;
  bind(unit, &slots_[static_cast<size_t>(use_slot_[i])]);
}

void LayerOffload::release(int unit, bool backward) {
  if (host_segments(unit).empty()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t i = cursor_;
  bind(unit, nullptr);
  if (backward) {
    states_[i] = UseState::UseState_writing;
    pending_write_backs_[static_cast<size_t>(unit)]++;
    write_backs_.push_back(i);
  } else {
    states_[i] = UseState::UseState_done;
    free_slots_.push_back(use_slot_[i]);
    use_slot_[i] = -1;
  }
  ++cursor_;
  changed_.notify_all();
}

double LayerOffload::take_wait_seconds() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(wait_seconds_, 0.0);
}

std::vector<OffloadCopy> LayerOffload::take_copies() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(copies_, {});
}

}  // namespace alloy
