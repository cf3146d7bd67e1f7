// The one error type of Alloy: what is wrong, where (file, field, rank) and how to fix it.
// The CLI prints it in one or two lines and exits with code 2.
#pragma once

#include <stdexcept>
#include <string>

namespace alloy {

struct ErrorWhere {
  std::string file;   // path of the input file, empty when not from a file
  std::string field;  // dotted field path inside the file, e.g. "nodes[1].device"
  int line = 0;       // 1-based line in the file, 0 when unknown
  int column = 0;     // 1-based column, 0 when unknown
};

class Error : public std::runtime_error {
 public:
  Error(std::string what, ErrorWhere where = {}, std::string hint = {});

  const std::string& message() const { return message_; }
  const ErrorWhere& where() const { return where_; }
  const std::string& hint() const { return hint_; }

  // "file:line:col: field: message" on one line, then "  fix: hint" when there is a hint.
  std::string format() const;

 private:
  std::string message_;
  ErrorWhere where_;
  std::string hint_;
};

// Exit code of the CLI for bad input; 1 is kept for internal failures.
inline constexpr int kExitBadInput = 2;

}  // namespace alloy
