#include "spec/error.hpp"

namespace alloy {

namespace {
std::string location_prefix(const ErrorWhere& where) {
  std::string out;
  if (!where.file.empty()) {
    out += where.file;
    if (where.line > 0) {
      out += ":" + std::to_string(where.line);
      if (where.column > 0) out += ":" + std::to_string(where.column);
    }
    out += ": ";
  }
  if (!where.field.empty()) out += where.field + ": ";
  return out;
}
}  // namespace

Error::Error(std::string what, ErrorWhere where, std::string hint)
    : std::runtime_error(location_prefix(where) + what),
      message_(std::move(what)),
      where_(std::move(where)),
      hint_(std::move(hint)) {}

std::string Error::format() const {
  std::string out = location_prefix(where_) + message_;
  if (!hint_.empty()) out += "\n  fix: " + hint_;
  return out;
}

}  // namespace alloy
