// Memory terms: every buffer name the runtime allocates under belongs to a term, measured terms
// sum to the arena's peak, and the plan's terms group into the same terms as the arena holds them.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/arena.hpp"
#include "runtime/memory_terms.hpp"
#include "runtime/parallel/dist_report.hpp"

namespace alloy {
namespace {

using K = MemoryTermKind;

bool identifier_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; }

// String literals of every call to allocate, allocate_floats, take or take_zeroed in `text`, from
// the call's name to the end of its statement (calls wrapped over lines included).
void call_literals(const std::string& text, std::map<std::string, std::string>& found, const std::string& file) {
  for (const char* call : {"allocate(", "allocate_floats(", "take(", "take_zeroed(", "take<"}) {
    const std::string needle = call;
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
      if (at > 0 && identifier_char(text[at - 1])) continue;  // cuda_memory_allocate(, ...
      const size_t end = text.find(';', at);
      for (size_t q = text.find('"', at); q < end; q = text.find('"', q + 1)) {
        const size_t close = text.find('"', q + 1);
        if (close == std::string::npos || close > end) break;
        found.emplace(text.substr(q + 1, close - q - 1), file);
        q = close;
      }
    }
  }
}

// Every literal buffer name under src/runtime but the arena itself (which only passes names on).
std::map<std::string, std::string> runtime_buffer_names() {
  std::map<std::string, std::string> found;
  namespace fs = std::filesystem;
  const std::string root = std::string(ALLOY_SOURCE_DIR) + "/src/runtime";
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(root)) {
    const std::string ext = e.path().extension().string();
    const std::string stem = e.path().stem().string();
    if (!e.is_regular_file() || stem == "arena" || (ext != ".cpp" && ext != ".hpp" && ext != ".cu" && ext != ".cuh"))
      continue;
    std::ifstream in(e.path());
    std::stringstream text;
    text << in.rdbuf();
    call_literals(text.str(), found, e.path().filename().string());
  }
  return found;
}

TEST(MemoryTerms, EveryBufferTheRuntimeAllocatesBelongsToATerm) {
  const std::map<std::string, std::string> names = runtime_buffer_names();
  // The scan itself works: it sees the model's, the optimizer's and the passes' buffers.
  for (const char* expected : {"parameters", "gradients", "adamw.m", "attn.qkv", "logits", "d residual", "stage input"})
    EXPECT_EQ(names.count(expected), 1u) << expected;
  EXPECT_GE(names.size(), 50u);
  for (const auto& [name, file] : names)
    EXPECT_NE(memory_term_of_buffer(name), K::MemoryTermKind_other) << "'" << name << "' (" << file << ") has no term";
  // Sharded gradients: the member's shard and the bucket being reduce-scattered.
  EXPECT_EQ(memory_term_of_buffer("sharded gradients"), K::MemoryTermKind_gradients);
  EXPECT_EQ(memory_term_of_buffer("gradient bucket"), K::MemoryTermKind_gradients);
}

TEST(MemoryTerms, BuffersGoWhereThePredictionCountsThem) {
  EXPECT_EQ(memory_term_of_buffer("parameters"), K::MemoryTermKind_parameters);
  EXPECT_EQ(memory_term_of_buffer("zero3 parameter pieces"), K::MemoryTermKind_parameters);
  EXPECT_EQ(memory_term_of_buffer("zero3 gathered weights"), K::MemoryTermKind_parameters);
  EXPECT_EQ(memory_term_of_buffer("offload window"), K::MemoryTermKind_parameters);
  EXPECT_EQ(memory_term_of_buffer("gradients"), K::MemoryTermKind_gradients);
  EXPECT_EQ(memory_term_of_buffer("adamw.v"), K::MemoryTermKind_optimizer_state);
  EXPECT_EQ(memory_term_of_buffer("parameters (fp32)"), K::MemoryTermKind_optimizer_state);  // master weights
  EXPECT_EQ(memory_term_of_buffer("attn.probs"), K::MemoryTermKind_activations);
  EXPECT_EQ(memory_term_of_buffer("stage output"), K::MemoryTermKind_activations);
  EXPECT_EQ(memory_term_of_buffer("d mlp.up"), K::MemoryTermKind_buffers);  // backward workspace
  EXPECT_EQ(memory_term_of_buffer("d some future gradient"), K::MemoryTermKind_buffers);
  EXPECT_EQ(memory_term_of_buffer("tied embedding gradient sum"), K::MemoryTermKind_buffers);
  EXPECT_EQ(memory_term_of_buffer("a buffer nobody named"), K::MemoryTermKind_other);
  EXPECT_EQ(memory_term_of_buffer("dropout mask"), K::MemoryTermKind_other);  // "d" alone is no prefix
}

TEST(MemoryTerms, MeasuredTermsSumToTheArenaPeak) {
  Arena arena(1 << 20);
  void* p = arena.allocate(1000, "parameters");
  void* g = arena.allocate(1000, "gradients");
  void* a = arena.allocate(300, "attn.qkv");
  void* d = arena.allocate(100, "d residual");
  void* x = arena.allocate(10, "something else");
  const MemoryTermBytes terms = memory_terms_measured(arena.peak_breakdown());
  int64_t total = 0;
  for (int64_t b : terms) total += b;
  EXPECT_EQ(total, arena.peak_bytes());
  EXPECT_EQ(terms[static_cast<size_t>(K::MemoryTermKind_parameters)], arena_rounded_bytes(1000));
  EXPECT_EQ(terms[static_cast<size_t>(K::MemoryTermKind_gradients)], arena_rounded_bytes(1000));
  EXPECT_EQ(terms[static_cast<size_t>(K::MemoryTermKind_optimizer_state)], 0);
  EXPECT_EQ(terms[static_cast<size_t>(K::MemoryTermKind_activations)], arena_rounded_bytes(300));
  EXPECT_EQ(terms[static_cast<size_t>(K::MemoryTermKind_buffers)], arena_rounded_bytes(100));
  EXPECT_EQ(terms[static_cast<size_t>(K::MemoryTermKind_other)], arena_rounded_bytes(10));
  for (void* b : {p, g, a, d, x}) arena.release(b);
}

// Every term plan evaluation writes (src/search/evaluate.cpp), each with its own power of two.
std::vector<MemoryTerm> every_plan_term() {
  const char* names[] = {"parameters",  "gradients", "master_weights",        "optimizer_states",
                         "zero3_gather", "offload_window", "activations",     "workspace",
                         "communication_buffers", "framework_context", "allocator_margin", "host_offload"};
  std::vector<MemoryTerm> terms;
  double bytes = 1;
  for (const char* name : names) {
    terms.push_back({name, bytes});
    bytes *= 2;
  }
  return terms;
}

TEST(MemoryTerms, PredictedTermsGroupWhatTheArenaHolds) {
  const std::vector<MemoryTerm> plan = every_plan_term();
  const auto terms = memory_terms_predicted(plan, true);
  EXPECT_EQ(terms[static_cast<size_t>(K::MemoryTermKind_parameters)], 1 + 16 + 32);  // + zero3 gather, offload window
  EXPECT_EQ(terms[static_cast<size_t>(K::MemoryTermKind_gradients)], 2);
  EXPECT_EQ(terms[static_cast<size_t>(K::MemoryTermKind_optimizer_state)], 4 + 8);  // master weights, states
  EXPECT_EQ(terms[static_cast<size_t>(K::MemoryTermKind_activations)], 64);
  EXPECT_EQ(terms[static_cast<size_t>(K::MemoryTermKind_buffers)], 128);  // workspace
  EXPECT_EQ(terms[static_cast<size_t>(K::MemoryTermKind_other)], 0);
  double total = 0;
  for (double b : terms) total += b;
  EXPECT_EQ(total, dist_predicted_arena_bytes(plan));  // communication library, context, margin, host: not in the arena
  // Offloading only activations: the window holds parked activations on their way back.
  const auto parked = memory_terms_predicted(plan, false);
  EXPECT_EQ(parked[static_cast<size_t>(K::MemoryTermKind_parameters)], 1 + 16);
  EXPECT_EQ(parked[static_cast<size_t>(K::MemoryTermKind_activations)], 64 + 32);
  // A term this grouping does not know still counts, as "other".
  const auto unknown = memory_terms_predicted({{"gradient_buckets", 5}}, false);
  EXPECT_EQ(unknown[static_cast<size_t>(K::MemoryTermKind_other)], 5);
}

TEST(MemoryTerms, NamesAndKeys) {
  std::set<std::string> names, keys;
  for (int k = 0; k < kMemoryTermKinds; ++k) {
    names.insert(memory_term_name(static_cast<MemoryTermKind>(k)));
    keys.insert(memory_term_key(static_cast<MemoryTermKind>(k)));
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(kMemoryTermKinds));
  EXPECT_EQ(keys.size(), static_cast<size_t>(kMemoryTermKinds));
  EXPECT_STREQ(memory_term_name(K::MemoryTermKind_optimizer_state), "optimizer state");
  EXPECT_STREQ(memory_term_key(K::MemoryTermKind_optimizer_state), "optimizer_state");
}

}  // namespace
}  // namespace alloy
