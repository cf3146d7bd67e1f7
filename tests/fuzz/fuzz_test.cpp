// A seeded mutation fuzzer over every input Alloy reads: model, cluster, training, plan and token
// files, each a small valid file mutated (lines deleted, duplicated or swapped; numbers made 0,
// -1, huge, 1e308, nan, text or null; files truncated; bytes flipped) and run through check,
// plan, explain, simulate or train, some with a numeric option made odd too, or an output file
// on a full disk (/dev/full). Every run must end with exit 0, or exit 2 and a message; never an
// internal error, a signal or a hang, and never exit 0 when an output could not be written.
//
// ALLOY_FUZZ_CASES=N runs N inputs (default 200), ALLOY_FUZZ_SEED=S changes them (default 1),
// ALLOY_FUZZ_CASE=I runs input I alone (to reproduce a failure the test printed), and
// ALLOY_FUZZ_JOBS=J runs J at a time (default: the hardware threads, at most 4).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cctype>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "../common/test_util.hpp"
#include "runtime/io/token_file.hpp"

namespace alloy {
namespace {

using testing::CommandResult;
using testing::TempDir;

constexpr int kCaseSeconds = 60;  // a run longer than this is a hang

enum class InputKind { InputKind_model, InputKind_cluster, InputKind_train, InputKind_plan, InputKind_tokens };

struct Seed {
  InputKind kind;
  std::string name;  // file name, whose extension decides how Alloy parses it
  std::string text;  // bytes of a valid input
  bool one_device_plan = false;  // plans: trainable without mpirun
};

struct FuzzCase {
  const Seed* seed = nullptr;
  std::string text;                    // the mutated input
  std::vector<std::string> mutations;  // what was done to the seed, in order
  std::string command;                 // alloy arguments; INPUT stands for the mutated file
  bool output_on_full_disk = false;    // an output goes to /dev/full: exit 0 would hide the loss
};

enum class Outcome { Outcome_ok, Outcome_refused, Outcome_internal_error, Outcome_signal, Outcome_hang, Outcome_silent_failure };

const char* outcome_name(Outcome o) {
  switch (o) {
    case Outcome::Outcome_ok: return "exit 0";
    case Outcome::Outcome_refused: return "exit 2 with a message";
    case Outcome::Outcome_internal_error: return "internal error";
    case Outcome::Outcome_signal: return "signal";
    case Outcome::Outcome_hang: return "hang";
    case Outcome::Outcome_silent_failure: return "other exit, no message, or exit 0 with an output lost";
  }
  return "?";
}

int64_t env_int(const char* name, int64_t fallback) {
  const char* text = std::getenv(name);
  return text != nullptr && *text != '\0' ? std::strtoll(text, nullptr, 10) : fallback;
}

std::string source_file(const std::string& relative) {
  return testing::read_text(std::string(ALLOY_SOURCE_DIR) + "/" + relative);
}

// --- mutations ------------------------------------------------------------------------------

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return lines;
}

std::string text_of(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text += line + "\n";
  return text;
}

const char* const kOddValues[] = {"0",    "-1",   "99999999999999999999", "18446744073709551616", "9223372036854775807",
                                  "1e308", "-1e308", "nan",               ".nan",                 "inf",
                                  "1.5",  "\"text\"", "null",             "~",                    "[]",
                                  "{}",   "true", "4294967297",           "2147483648",           "-0"};

using Rng = std::mt19937_64;

size_t pick(Rng& rng, size_t count) { return std::uniform_int_distribution<size_t>(0, count - 1)(rng); }

// (start, length) of every number in `text`: an optional minus, digits, an optional fraction
// and an optional exponent, not part of a longer word.
std::vector<std::pair<size_t, size_t>> number_spans(const std::string& text) {
  auto digit = [&](size_t i) { return i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])) != 0; };
  auto digits_end = [&](size_t i) {
    while (digit(i)) ++i;
    return i;
  };
  std::vector<std::pair<size_t, size_t>> spans;
  for (size_t i = 0; i < text.size(); ++i) {
    const bool word_before = i > 0 && (std::isalnum(static_cast<unsigned char>(text[i - 1])) != 0 || text[i - 1] == '_');
    if (!digit(i) || word_before) continue;
    const size_t begin = i > 0 && text[i - 1] == '-' ? i - 1 : i;
    size_t end = digits_end(i);
    if (end < text.size() && text[end] == '.' && digit(end + 1)) end = digits_end(end + 1);
    if (end < text.size() && (text[end] == 'e' || text[end] == 'E')) {
      const size_t sign = end + 1 < text.size() && (text[end + 1] == '-' || text[end + 1] == '+') ? end + 2 : end + 1;
      if (digit(sign)) end = digits_end(sign);
    }
    spans.emplace_back(begin, end - begin);
    i = end;
  }
  return spans;
}

// (start, length) of every value written after ": ": a quoted string, or the run of characters
// up to a space, comma or bracket.
std::vector<std::pair<size_t, size_t>> value_spans(const std::string& text) {
  std::vector<std::pair<size_t, size_t>> spans;
  for (size_t at = text.find(": "); at != std::string::npos; at = text.find(": ", at + 1)) {
    const size_t begin = at + 2;
    size_t end = begin;
    if (begin < text.size() && text[begin] == '"') {
      end = text.find('"', begin + 1);
      if (end == std::string::npos) continue;
      ++end;
    } else {
      while (end < text.size() && std::isspace(static_cast<unsigned char>(text[end])) == 0 &&
             std::string_view(",{}[]").find(text[end]) == std::string_view::npos)
        ++end;
    }
    if (end > begin) spans.emplace_back(begin, end - begin);
  }
  return spans;
}

// One mutation of a text input; returns what it did.
std::string text_mutate(std::string* text, Rng& rng) {
  std::vector<std::string> lines = lines_of(*text);
  const int kind = static_cast<int>(pick(rng, 6));
  if (kind <= 2 && lines.size() >= 2) {
    const size_t a = pick(rng, lines.size()), b = pick(rng, lines.size());
    std::string what;
    if (kind == 0) {
      what = "delete line " + std::to_string(a + 1);
      lines.erase(lines.begin() + static_cast<std::ptrdiff_t>(a));
    } else if (kind == 1) {
      what = "duplicate line " + std::to_string(a + 1);
      lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(a), lines[a]);
    } else {
      what = "swap lines " + std::to_string(a + 1) + " and " + std::to_string(b + 1);
      std::swap(lines[a], lines[b]);
    }
    *text = text_of(lines);
    return what;
  }
  if (kind == 3 || kind == 4) {  // a number, or any value after a colon, becomes an odd value
    const std::vector<std::pair<size_t, size_t>> spans = kind == 3 ? number_spans(*text) : value_spans(*text);
    if (!spans.empty()) {
      const auto [at, length] = spans[pick(rng, spans.size())];
      const std::string value = kOddValues[pick(rng, std::size(kOddValues))];
      const std::string what = "value '" + text->substr(at, length) + "' at byte " + std::to_string(at) + " -> " + value;
      text->replace(at, length, value);
      return what;
    }
  }
  if (kind == 5 && !text->empty()) {
    const size_t at = pick(rng, text->size());
    text->resize(at);
    return "truncate to " + std::to_string(at) + " bytes";
  }
  if (text->empty()) return "none (empty)";
  const size_t at = pick(rng, text->size());
  const auto bit = static_cast<char>(1 << pick(rng, 8));
  (*text)[at] = static_cast<char>((*text)[at] ^ bit);
  return "flip bit " + std::to_string(static_cast<int>(static_cast<unsigned char>(bit))) + " of byte " + std::to_string(at);
}

// One mutation of a token file: its header's fields, its length, or its bytes.
std::string tokens_mutate(std::string* bytes, Rng& rng) {
  const int kind = static_cast<int>(pick(rng, 5));
  if (kind == 0) {
    const size_t at = pick(rng, bytes->size() + 1);
    bytes->resize(at);
    return "truncate to " + std::to_string(at) + " bytes";
  }
  if (kind == 1 || kind == 2) {
    const int32_t values[] = {0, -1, 1, 2, 3, 7, INT32_MAX, INT32_MIN, 513, 100000};
    const size_t field = kind == 1 ? 2 : pick(rng, 3);  // token count, or magic / version / count
    const int32_t value = values[pick(rng, std::size(values))];
    if (bytes->size() >= (field + 1) * 4) std::memcpy(bytes->data() + field * 4, &value, 4);
    return "header[" + std::to_string(field) + "] = " + std::to_string(value);
  }
  if (kind == 3) {
    bytes->push_back('\x01');
    return "append one byte";
  }
  if (bytes->empty()) return "none (empty)";
  const size_t at = pick(rng, bytes->size());
  (*bytes)[at] = static_cast<char>((*bytes)[at] ^ 0xff);
  return "flip byte " + std::to_string(at);
}

// One numeric option of `command` given an odd value; false when it has none.
bool option_mutate(std::string* command, Rng& rng, std::string* what) {
  const char* const odd[] = {"0", "-1", "nan", "inf", "1e308", "18446744073709551616", "100000", "3x", "-0.5"};
  struct Found {
    std::string name;
    size_t at, length;  // the value's place in the command
  };
  std::vector<Found> found;
  for (const char* name : {"steps", "batch", "seq-len", "global-batch", "threads", "lr"}) {
    const std::string flag = std::string("--") + name + " ";
    for (size_t at = command->find(flag); at != std::string::npos; at = command->find(flag, at + 1)) {
      const size_t begin = at + flag.size();
      const size_t end = std::min(command->find(' ', begin), command->size());
      if (end > begin) found.push_back({name, begin, end - begin});
    }
  }
  if (found.empty()) return false;
  const Found& m = found[pick(rng, found.size())];
  const size_t at = m.at, length = m.length;
  std::string value = odd[pick(rng, std::size(odd))];
  if (value == "100000" && m.name != "threads") value = "0";  // a valid long run is no finding
  *what = "option value '" + command->substr(at, length) + "' -> " + value;
  command->replace(at, length, value);
  return true;
}

// The option that sends one of the command's outputs to /dev/full (writes fail with ENOSPC).
std::string full_disk_option(const std::string& command) {
  if (command.starts_with("plan ")) return " -o /dev/full";
  if (command.starts_with("simulate ")) return " --trace /dev/full";
  if (command.starts_with("train ")) return " --log /dev/full";
  return {};
}

// --- commands per kind of input ---------------------------------------------------------------

struct Fixture {
  TempDir dir;
  std::vector<Seed> seeds;
  std::string tokens;  // a valid token file for runs that train
};

std::vector<std::string> commands_for(const Seed& seed, const Fixture& f) {
  const std::string train = "train --no-progress --steps 1 --lr 1e-3 --memory-cap 512MiB --threads 1 ";
  switch (seed.kind) {
    case InputKind::InputKind_model:
      return {"check --model INPUT", "plan --no-simulate --model INPUT --cluster local-cpu-1 --global-batch 4",
              train + "--model INPUT --batch 2 --seq-len 8 --data " + f.tokens};
    case InputKind::InputKind_cluster:
      return {"check --cluster INPUT", "plan --no-simulate --model tiny-gpt --cluster INPUT --global-batch 4"};
    case InputKind::InputKind_train:
      return {"check --model tiny-gpt --train INPUT",
              "plan --no-simulate --model tiny-gpt --cluster local-cpu-1 --train INPUT",
              train + "--model tiny-gpt --train INPUT --data " + f.tokens};
    case InputKind::InputKind_plan:
      if (seed.one_device_plan)
        return {"explain INPUT", "simulate --plan INPUT", train + "--model tiny-gpt --plan INPUT --data " + f.tokens};
      return {"explain INPUT", "simulate --plan INPUT", "explain INPUT --model tiny-gpt --cluster local-cpu-2"};
    case InputKind::InputKind_tokens:
      return {train + "--model tiny-gpt --batch 2 --seq-len 16 --data INPUT",
              train + "--model tiny-gpt --batch 2 --seq-len 16 --data " + f.tokens + " --val-data INPUT"};
  }
  return {};
}

void fixture_build(Fixture* f) {
  const std::string licenses = source_file("examples/data/fsf_licenses.txt").substr(0, 3000);
  std::vector<uint32_t> ids(licenses.begin(), licenses.end());
  for (uint32_t& id : ids) id &= 0xff;
  f->tokens = f->dir.path() + "/tokens.bin";
  token_file_write(f->tokens, ids, TokenFileVersion::TokenFileVersion_uint16);
  ids.resize(600);
  const std::string small_tokens = f->dir.path() + "/small.bin";
  token_file_write(small_tokens, ids, TokenFileVersion::TokenFileVersion_uint32);

  using K = InputKind;
  for (const char* m : {"tiny-gpt.yaml", "tiny-llama.yaml", "gpt2.json", "llama-2-7b.json"})
    f->seeds.push_back({K::InputKind_model, m, source_file(std::string("examples/models/") + m)});
  for (const char* c : {"local-cpu-1.yaml", "local-cpu-4.yaml", "a100-v100.yaml", "h100-a100-l4.yaml"})
    f->seeds.push_back({K::InputKind_cluster, c, source_file(std::string("examples/clusters/") + c)});
  for (const char* t : {"tiny-cpu.yaml", "llama-pretrain.yaml"})
    f->seeds.push_back({K::InputKind_train, t, source_file(std::string("examples/train/") + t)});
  const std::string one = f->dir.path() + "/one.json", two = f->dir.path() + "/two.json";
  const std::string tiny_train = std::string(ALLOY_SOURCE_DIR) + "/examples/train/tiny-cpu.yaml";
  CommandResult a = testing::alloy("plan --model tiny-gpt --cluster local-cpu-1 --global-batch 4 --train " + tiny_train + " -o " + one);
  CommandResult b = testing::alloy("plan --model tiny-gpt --cluster local-cpu-2 --pp 2 --train " + tiny_train + " -o " + two);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(b.exit_code, 0) << b.output;
  f->seeds.push_back({K::InputKind_plan, "plan.json", testing::read_text(one), true});
  f->seeds.push_back({K::InputKind_plan, "plan.json", testing::read_text(two), false});
  f->seeds.push_back({K::InputKind_tokens, "tokens.bin", testing::read_text(small_tokens)});
}

FuzzCase case_make(const Fixture& f, uint64_t seed, int64_t index) {
  Rng rng(seed * 1000003u + static_cast<uint64_t>(index));
  FuzzCase c;
  c.seed = &f.seeds[pick(rng, f.seeds.size())];
  c.text = c.seed->text;
  const size_t count = 1 + pick(rng, 3);
  for (size_t i = 0; i < count; ++i)
    c.mutations.push_back(c.seed->kind == InputKind::InputKind_tokens ? tokens_mutate(&c.text, rng) : text_mutate(&c.text, rng));
  const std::vector<std::string> commands = commands_for(*c.seed, f);
  c.command = commands[pick(rng, commands.size())];
  const size_t extra = pick(rng, 8);
  std::string what;
  if (extra == 0 && option_mutate(&c.command, rng, &what)) c.mutations.push_back(what);
  if (extra == 1 && !full_disk_option(c.command).empty()) {
    c.command += full_disk_option(c.command);
    c.output_on_full_disk = true;
    c.mutations.push_back("output on a full disk");
  }
  return c;
}

struct CaseResult {
  Outcome outcome = Outcome::Outcome_ok;
  std::string command;
  std::string output;
};

CaseResult case_run(const FuzzCase& c) {
  TempDir dir;
  const std::string input = dir.write(c.seed->name, c.text);
  CaseResult r;
  r.command = c.command;
  for (size_t at; (at = r.command.find("INPUT")) != std::string::npos;) r.command.replace(at, 5, input);
  // OMP_WAIT_POLICY set: the binary does not restart itself, so the time limit covers one process.
  const std::string shell = "env OMP_WAIT_POLICY=passive timeout -k 5 " + std::to_string(kCaseSeconds) + " " + ALLOY_BINARY +
                            " " + r.command;
  const CommandResult run = testing::run_command(shell, kCaseSeconds + 30);
  r.output = run.output;
  const int code = run.exit_code;
  if (code == 124 || code == 137 || run.signal == 9) {
    r.outcome = Outcome::Outcome_hang;
  } else if (run.signal != 0 || code > 128) {
    r.outcome = Outcome::Outcome_signal;
  } else if (run.output.find("internal error") != std::string::npos) {
    r.outcome = Outcome::Outcome_internal_error;
  } else if (code == 0) {
    r.outcome = c.output_on_full_disk ? Outcome::Outcome_silent_failure : Outcome::Outcome_ok;
  } else if (code == 2 && run.output.find("error") != std::string::npos) {
    r.outcome = Outcome::Outcome_refused;
  } else {
    r.outcome = Outcome::Outcome_silent_failure;
  }
  return r;
}

std::string printable(const std::string& text, InputKind kind) {
  if (kind != InputKind::InputKind_tokens) return text.size() > 4000 ? text.substr(0, 4000) + "\n[...]" : text;
  std::string out = std::to_string(text.size()) + " bytes; header ints:";
  for (size_t i = 0; i < 3 && (i + 1) * 4 <= text.size(); ++i) {
    int32_t value = 0;
    std::memcpy(&value, text.data() + i * 4, 4);
    out += " " + std::to_string(value);
  }
  return out;
}

std::string case_report(const FuzzCase& c, const CaseResult& r, uint64_t seed, int64_t index) {
  std::string mutations;
  for (const std::string& m : c.mutations) mutations += (mutations.empty() ? "" : "; ") + m;
  return "ALLOY_FUZZ_SEED=" + std::to_string(seed) + " ALLOY_FUZZ_CASE=" + std::to_string(index) + ": " +
         outcome_name(r.outcome) + "\n  seed input: " + c.seed->name + "\n  mutations: " + mutations +
         "\n  command: alloy " + r.command + "\n  output:\n" + r.output + "\n  input:\n" + printable(c.text, c.seed->kind) +
         "\n";
}

// Runs cases [first, end) on `jobs` threads, each case in a process of its own.
std::vector<std::pair<FuzzCase, CaseResult>> cases_run(const Fixture& f, uint64_t seed, int64_t first, int64_t end, int jobs) {
  std::vector<std::pair<FuzzCase, CaseResult>> out(static_cast<size_t>(end - first));
  std::atomic<int64_t> next{first};
  auto work = [&] {
    for (int64_t index = next++; index < end; index = next++) {
      auto& [c, r] = out[static_cast<size_t>(index - first)];
      c = case_make(f, seed, index);
      r = case_run(c);
    }
  };
  std::vector<std::thread> workers;
  for (int j = 0; j < jobs; ++j) workers.emplace_back(work);
  for (std::thread& w : workers) w.join();
  return out;
}

TEST(Fuzz, MutatedInputsExitCleanly) {
  Fixture f;
  fixture_build(&f);
  if (::testing::Test::HasFatalFailure()) return;
  const auto seed = static_cast<uint64_t>(env_int("ALLOY_FUZZ_SEED", 1));
  const int64_t only = env_int("ALLOY_FUZZ_CASE", -1);
  const int64_t cases = env_int("ALLOY_FUZZ_CASES", 200);
  const int jobs = static_cast<int>(env_int("ALLOY_FUZZ_JOBS", std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 4)));
  const int64_t first = only >= 0 ? only : 0;
  const auto results = cases_run(f, seed, first, only >= 0 ? only + 1 : cases, only >= 0 ? 1 : jobs);
  std::map<Outcome, int64_t> counts;
  std::vector<std::string> failures;
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& [c, r] = results[i];
    ++counts[r.outcome];
    const bool bad = r.outcome != Outcome::Outcome_ok && r.outcome != Outcome::Outcome_refused;
    if (bad || only >= 0) failures.push_back(case_report(c, r, seed, first + static_cast<int64_t>(i)));
  }
  std::string summary = "fuzz: seed " + std::to_string(seed) + ":";
  for (const auto& [outcome, count] : counts) summary += " " + std::string(outcome_name(outcome)) + " " + std::to_string(count) + ";";
  std::printf("%s\n", summary.c_str());
  if (only >= 0) {
    std::printf("%s", failures.front().c_str());
    return;
  }
  for (size_t i = 0; i < failures.size() && i < 10; ++i) ADD_FAILURE() << failures[i];
  EXPECT_TRUE(failures.empty()) << failures.size() << " of " << cases << " inputs ended badly; " << summary;
}

}  // namespace
}  // namespace alloy
