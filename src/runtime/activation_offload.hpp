// Activation offload: after the forward of a marked block, the activations it saved for its
// backward are copied to host memory on a copy thread and their device buffers freed; when the
// backward reaches the block they are copied back, the next `depth` marked blocks of the same
// pass fetched ahead. Both directions share the device's paced host link with weight offload
// (docs/runtime-offload.md).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/arena.hpp"
#include "runtime/model.hpp"
#include "runtime/offload.hpp"

namespace alloy {

class ActivationOffload : public ActivationStore {
 public:
  // offloaded: per global block. Host copies come from `host`; device buffers from the model's arena.
  ActivationOffload(Model& model, std::vector<bool> offloaded, int prefetch_depth, HostLink& link, Arena& host);
  ~ActivationOffload() override;
  ActivationOffload(const ActivationOffload&) = delete;
  ActivationOffload& operator=(const ActivationOffload&) = delete;

  void saved(ChunkPass& pass, int layer) override;
  void needed(ChunkPass& pass, int layer) override;
  void dropped(ChunkPass& pass) override;

  // Seconds the passes waited on copies since the last call.
  double take_wait_seconds();
  // The copies since the last call (use.block: the layer; use.backward: copied back).
  std::vector<OffloadCopy> take_copies();

 private:
  enum class RecordState { RecordState_storing, RecordState_stored, RecordState_loading };
  struct Piece {
    float** field = nullptr;  // in the pass's BlockActivations
    float* device = nullptr;
    float* host = nullptr;
    int64_t bytes = 0;
    std::string name;         // the device buffer's arena name
  };
  struct Record {
    ChunkPass* pass = nullptr;
    int layer = 0;
    std::vector<Piece> pieces;
    RecordState state = RecordState::RecordState_storing;
    bool copy_done = false;
  };
  Record* find(const ChunkPass& pass, int layer);
  void wait_copied(std::unique_lock<std::mutex>& lock, const Record& record);
  void reap(std::unique_lock<std::mutex>& lock);  // frees device buffers of finished stores
  void issue_load(Record& record);
  void copy_loop(bool to_device);

  Model& model_;
  std::vector<bool> offloaded_;
  int depth_;
  HostLink& link_;
  Arena& host_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::list<Record> records_;
  std::deque<Record*> stores_;
  std::deque<Record*> loads_;
  bool stop_ = false;
  double wait_seconds_ = 0;
  std::vector<OffloadCopy> copies_;
  std::thread storer_;
  std::thread loader_;
};

}  // namespace alloy
