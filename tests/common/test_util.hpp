// Helpers shared by test binaries: a temporary folder that cleans up, and running a command
// with its output and exit status captured.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace alloy::testing {

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "alloy-test-XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string write(const std::string& name, const std::string& text) const {
    std::string file = path_ + "/" + name;
    std::ofstream(file, std::ios::binary) << text;
    return file;
  }

 private:
  std::string path_;
};

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct CommandResult {
  int exit_code = -1;   // -1 when killed by a signal
  int signal = 0;
  std::string output;   // stdout and stderr together
};

// Runs `command` through the shell with a time limit (seconds), capturing its output.
inline CommandResult run_command(const std::string& command, int timeout_seconds = 60) {
  TempDir dir;
  std::string out_file = dir.path() + "/out.txt";
  std::string full = "timeout -s KILL " + std::to_string(timeout_seconds) + " " + command + " > " + out_file + " 2>&1";
  int status = std::system(full.c_str());
  CommandResult r;
  r.output = read_text(out_file);
  if (WIFEXITED(status)) {
    r.exit_code = WEXITSTATUS(status);
    if (r.exit_code == 137) r.signal = 9;  // killed by the time limit
  } else if (WIFSIGNALED(status)) {
    r.signal = WTERMSIG(status);
  }
  return r;
}

// The alloy binary with `args`, as a user runs it.
inline CommandResult alloy(const std::string& args, int timeout_seconds = 120) {
  return run_command(std::string(ALLOY_BINARY) + " " + args, timeout_seconds);
}

// mpirun refuses root and more ranks than cores unless told; leak checking is off in the ranks
// of a sanitized build because the MPI library keeps allocations until exit. Each test process
// gives its mpirun jobs a session folder of their own: Open MPI 4 creates /tmp/ompi.<host>.<uid>
// with a check-then-mkdir that fails ("mkdir ... File exists") when ctest -j starts two jobs at
// once (open-mpi/ompi#8510). The folder goes when the test process exits.
inline void mpi_test_environment_set() {
  static const TempDir session_base;
  setenv("OMPI_MCA_orte_tmpdir_base", session_base.path().c_str(), 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
  const char* asan = std::getenv("ASAN_OPTIONS");
  const std::string options = asan != nullptr ? std::string(asan) + ":detect_leaks=0" : "detect_leaks=0";
  setenv("ASAN_OPTIONS", options.c_str(), 1);
}

}  // namespace alloy::testing
