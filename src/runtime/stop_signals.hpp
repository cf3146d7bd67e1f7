// Stopping a run on SIGTERM, SIGINT, SIGHUP or SIGUSR1: the handler only records the signal, and
// the training loop reads it at the next step boundary, so every rank stops after the same step
// (and saves it). A second signal ends the process at once, with a note on stderr and exit
// status 128 + the signal.
#pragma once

namespace alloy {

// Installs the handlers while it lives; restores the previous ones when it goes.
class StopSignals {
 public:
  StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  ~StopSignals();

  // The first signal received since construction; 0 for none.
  static int received();
};

// "SIGTERM" and so on; "a signal" for others.
const char* stop_signal_name(int signal);

}  // namespace alloy
