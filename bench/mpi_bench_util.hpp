// Shared by the benchmarks that drive the alloy binary under mpirun: running commands, the
// mpirun prefix and environment, medians, the error lines of a failed run, reading a run's
// step log, and calibrating a profile from the median of a few runs.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace alloy::bench {

// The alloy binary next to this benchmark.
inline std::string alloy_next_to_self() {
  return std::filesystem::canonical("/proc/self/exe").parent_path().string() + "/alloy";
}

inline int run(const std::string& command) {
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

inline std::string mpirun(int ranks) { return fmt::format("mpirun -np {} --oversubscribe --bind-to none", ranks); }

// mpirun refuses more ranks than cores, and root, unless told.
inline void mpi_environment_set() {
  setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
  if (getuid() == 0) {
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  }
}

inline void write_file(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// --steps N (at least 3) and --rounds N (at least 1) from the command line, else the defaults.
struct StepsAndRounds {
  int steps = 0;
  int rounds = 0;
};
inline StepsAndRounds steps_and_rounds(int argc, char** argv, int steps, int rounds) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--steps") steps = std::max(3, std::atoi(argv[i + 1]));
    if (flag == "--rounds") rounds = std::max(1, std::atoi(argv[i + 1]));
  }
  return {steps, rounds};
}

// A fresh folder under the temporary directory for this process's files: prefix-PID.
inline std::string bench_folder(const std::string& prefix) {
  const std::string dir = std::filesystem::temp_directory_path() / (prefix + "-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  return dir;
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The lines of a failed command's output that say what went wrong, indented.
inline std::string errors_in(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  for (std::string line; std::getline(in, line);)
    if (line.find("error") != std::string::npos || line.find("fix:") != std::string::npos) text += "    " + line + "\n";
  return text;
}

// One `alloy train --log` run, from its step log.
struct RunResult {
  double step_seconds = 0;               // median of the steps after the first (it warms up)
  double tokens_per_second = 0;          // median of the same steps
  std::vector<double> peak_arena_bytes;  // per rank, over all steps
};

inline RunResult run_result_read(const std::string& log) {
  RunResult r;
  std::vector<double> step_seconds, rates;
  std::ifstream in(log);
  int line_number = 0;
  for (std::string line; std::getline(in, line); ++line_number) {
    if (line_number == 0) continue;
    const nlohmann::json j = nlohmann::json::parse(line);
    step_seconds.push_back(j.at("step_seconds").get<double>());
    rates.push_back(j.at("tokens_per_second").get<double>());
    const nlohmann::json& ranks = j.at("ranks");
    r.peak_arena_bytes.resize(ranks.size(), 0.0);
    for (size_t k = 0; k < ranks.size(); ++k)
      r.peak_arena_bytes[k] = std::max(r.peak_arena_bytes[k], ranks.at(k).at("peak_arena_bytes").get<double>());
  }
  r.step_seconds = median(step_seconds);
  r.tokens_per_second = median(rates);
  return r;
}

// The lines of a run's output that say how measurement compared with the plan per device type.
inline std::string calibration_lines_in(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  for (std::string line; std::getline(in, line);)
    if (line.rfind("measured / predicted on", 0) == 0) text += "    " + line + "\n";
  return text;
}

// Calibrates a profile as a user would, from a run of a plan made with it, but from the run of
// median step time among `rounds`: this machine's cores have slow spells, and one run caught in
// one (or lucky to miss them all) would shift every later prediction. `train_command(log,
// calibrated)` is the mpirun command line of one run that writes its step log and calibrated
// profile to those paths; its output goes to a file whose calibration lines end up in
// `*report`. Returns false when a run failed.
inline bool calibrate_from_median_run(const std::function<std::string(const std::string&, const std::string&)>& train_command,
                                      int rounds, const std::string& work_prefix, const std::string& calibrated_out,
                                      std::string* report) {
  struct Calibration {
    double step_seconds = 0;
    std::string profile, output;
  };
  std::vector<Calibration> runs;
  for (int round = 0; round < rounds; ++round) {
    const Calibration c{0, fmt::format("{}-{}.json", work_prefix, round), fmt::format("{}-{}.out", work_prefix, round)};
    const std::string log = fmt::format("{}-{}.jsonl", work_prefix, round);
    if (run(fmt::format("{} > {} 2>&1", train_command(log, c.profile), c.output)) != 0) return false;
    runs.push_back(c);
    runs.back().step_seconds = run_result_read(log).step_seconds;
  }
  std::sort(runs.begin(), runs.end(), [](const Calibration& a, const Calibration& b) { return a.step_seconds < b.step_seconds; });
  const Calibration& chosen = runs[runs.size() / 2];
  std::filesystem::copy_file(chosen.profile, calibrated_out, std::filesystem::copy_options::overwrite_existing);
  if (report != nullptr) *report = calibration_lines_in(chosen.output);
  return true;
}

}  // namespace alloy::bench
