// The device arena: every device-resident buffer of a rank (parameters, gradients, optimizer
// state, activations, workspace) is allocated here, under a hard capacity, with exact accounting
// so the measured peak can be compared with the planner's prediction.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace alloy {

inline constexpr int64_t kArenaAlignmentBytes = 64;

// Bytes one allocation of `bytes` occupies in the arena (rounded up to the alignment).
inline int64_t arena_rounded_bytes(int64_t bytes) {
  return (bytes + kArenaAlignmentBytes - 1) / kArenaAlignmentBytes * kArenaAlignmentBytes;
}

// Where an arena's memory comes from: host memory (the CPU runtime) or a GPU's (cudaMalloc).
// allocate returns nullptr when the memory is not there.
struct ArenaMemory {
  void* (*allocate)(int64_t bytes);
  void (*free)(void* pointer);
  const char* kind;  // "host" or "GPU", for error messages
};

// 64-byte aligned host memory; blocks of 2 MiB and more on transparent huge pages.
ArenaMemory arena_host_memory();

class Arena {
 public:
  explicit Arena(int64_t capacity_bytes, std::string device_name = "cpu", ArenaMemory memory = arena_host_memory());
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // 64-byte aligned, uninitialised. Throws alloy::Error when the capacity would be exceeded;
  // `what` names the buffer in that message.
  void* allocate(int64_t bytes, const char* what);
  float* allocate_floats(int64_t count, const char* what) {
    return static_cast<float*>(allocate(count * static_cast<int64_t>(sizeof(float)), what));
  }
  // Returns a buffer to the arena; nullptr is ignored. The memory is kept for reuse by a later
  // allocation of the same size (training steps repeat the same sizes), but no longer counts.
  void release(void* pointer);
  // Frees the memory kept for reuse back to the system.
  void trim();
  // The rounded bytes and the name of a live allocation (throws alloy::Error for others).
  std::pair<int64_t, const std::string*> allocation(const void* pointer) const;

  int64_t capacity_bytes() const { return capacity_bytes_; }
  int64_t bytes_in_use() const { return bytes_in_use_; }
  int64_t peak_bytes() const { return peak_bytes_; }
  // Starts a new high-water mark at what is in use now (and its breakdown with it).
  void reset_peak();
  // What was allocated at the peak: rounded bytes by buffer name, largest first; sums to
  // peak_bytes().
  std::vector<std::pair<std::string, int64_t>> peak_breakdown() const;
  const std::string& device_name() const { return device_name_; }

 private:
  int64_t capacity_bytes_;
  std::string device_name_;
  ArenaMemory memory_;
  int64_t bytes_in_use_ = 0;
  int64_t peak_bytes_ = 0;
  struct Live {
    int64_t bytes;     // rounded
    std::string what;  // the buffer's name
  };
  void peak_record();
  std::unordered_map<void*, Live> live_;
  std::map<std::string, int64_t> peak_by_name_;  // live_ summed by name at the last peak
  std::multimap<int64_t, void*> cached_;      // rounded bytes -> free block kept for reuse
};

}  // namespace alloy
