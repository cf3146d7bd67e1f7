// Shared by the benchmarks that drive the alloy binary under mpirun: running commands, the
// mpirun prefix and environment, medians, and the error lines of a failed run.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

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

}  // namespace alloy::bench
