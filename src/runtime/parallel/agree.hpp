// Agreement on errors across ranks: a problem one rank finds before training is told to every
// rank, so each reports the same error and exits normally instead of leaving peers waiting.
#pragma once

#include <functional>
#include <string>

#include "runtime/parallel/communicator.hpp"
#include "spec/error.hpp"

namespace alloy {

// An error every rank found (or was told of) at the same point: each rank reports it and exits
// normally, instead of aborting the job.
class AgreedError : public Error {
 public:
  using Error::Error;
};

// Training produced numbers that are not finite (NaN or Inf): every rank stops at the same
// step with this error, which the CLI reports with kExitNonFinite.
class NonFiniteError : public AgreedError {
 public:
  using AgreedError::AgreedError;
};

// Exit code of `alloy train` when the run stopped on numbers that are not finite: distinct from
// bad input (kExitBadInput), as the input was valid and the numbers diverged while training.
inline constexpr int kExitNonFinite = 3;

// What the first rank that found something reported, with that rank (-1 and "" when no rank did).
struct RankFinding {
  int rank = -1;
  std::string text;
};

// Every rank calls it with what it found ("" for nothing); returns the lowest rank's finding on
// every rank. Collective over the world.
RankFinding dist_first_finding(Communicator& comm, const std::string& found);

// Every rank calls it with its own problem ("" for none); throws the first rank's problem as an
// AgreedError on every rank ("rank R of N: ..."), or returns when all are fine.
void dist_agree(Communicator& comm, const std::string& problem);
// Runs `check` on every rank and agrees on the alloy::Errors it throws.
void dist_agree_on(Communicator& comm, const std::function<void()>& check);

}  // namespace alloy
