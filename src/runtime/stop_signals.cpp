// Async-signal-safe stop handlers (see stop_signals.hpp).
#include "runtime/stop_signals.hpp"

#include <unistd.h>

#include <array>
#include <csignal>

namespace alloy {

namespace {

constexpr std::array<int, 4> kStopSignals = {SIGTERM, SIGINT, SIGHUP, SIGUSR1};

volatile std::sig_atomic_t g_received = 0;
std::array<struct sigaction, kStopSignals.size()> g_previous{};

extern "C" void stop_signal_handle(int signal) {
  if (g_received != 0) {  // a second signal: the user means now
    static const char kNote[] = "alloy: second stop signal: exiting now, without saving this step\n";
    const ssize_t written = write(STDERR_FILENO, kNote, sizeof(kNote) - 1);  // nothing to do if it fails
    static_cast<void>(written);
    _exit(128 + signal);
  }
  g_received = signal;
}

}  // namespace

StopSignals::StopSignals() {
  g_received = 0;
  struct sigaction action {};
  action.sa_handler = stop_signal_handle;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // blocking reads and MPI's polls carry on; the loop checks the flag
  for (size_t i = 0; i < kStopSignals.size(); ++i) sigaction(kStopSignals[i], &action, &g_previous[i]);
}

StopSignals::~StopSignals() {
  for (size_t i = 0; i < kStopSignals.size(); ++i) sigaction(kStopSignals[i], &g_previous[i], nullptr);
}

int StopSignals::received() { return g_received; }

const char* stop_signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGHUP: return "SIGHUP";
    case SIGUSR1: return "SIGUSR1";
    default: return "a signal";
  }
}

}  // namespace alloy
