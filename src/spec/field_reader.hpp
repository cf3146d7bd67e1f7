// FieldReader: typed access to the fields of a parsed YAML or JSON spec file, where every
// problem becomes an alloy::Error naming the file, line, field path and what to write instead.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "spec/error.hpp"

namespace alloy {

// Parses a file by extension: .json strictly as JSON, anything else as YAML. Missing or
// unreadable files and syntax errors (with line and column) become alloy::Error.
YAML::Node spec_file_parse(const std::string& path);

// A file's whole text; a missing or unreadable file becomes alloy::Error.
std::string spec_file_text(const std::string& path);

// `text` as a double-quoted YAML scalar.
std::string yaml_quoted(const std::string& text);

// Same as spec_file_parse for text already in memory; `path` is only used in messages.
YAML::Node spec_text_parse(const std::string& text, const std::string& path, bool is_json);

class FieldReader {
 public:
  FieldReader(YAML::Node node, std::string file, std::string path = "");

  bool has(const std::string& key) const;
  bool is_null(const std::string& key) const;  // absent or explicit null

  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_double(const std::string& key) const;
  double get_double(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::string get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;

  // Quantities with units (see spec/units.hpp); `example` appears in the error message.
  double get_bytes(const std::string& key, std::optional<double> fallback = std::nullopt) const;
  double get_bandwidth(const std::string& key, std::optional<double> fallback = std::nullopt) const;
  double get_seconds(const std::string& key, std::optional<double> fallback = std::nullopt) const;
  double get_flops(const std::string& key, std::optional<double> fallback = std::nullopt) const;

  FieldReader child(const std::string& key) const;      // must be a mapping
  std::vector<FieldReader> list(const std::string& key) const;  // must be a sequence of mappings
  size_t list_size(const std::string& key) const;               // items of a sequence of anything
  std::vector<std::string> keys() const;

  // Errors on any key not in `known`, suggesting the nearest known key (catches typos).
  void reject_unknown(std::initializer_list<const char*> known) const;

  ErrorWhere where(const std::string& key = "") const;
  [[noreturn]] void fail(const std::string& key, const std::string& what, const std::string& hint) const;

  const std::string& file() const { return file_; }
  const std::string& path() const { return path_; }

 private:
  YAML::Node value(const std::string& key) const;  // required scalar; fails when absent
  std::string field_path(const std::string& key) const;
  double get_quantity(const std::string& key, std::optional<double> fallback,
                      std::optional<double> (*parse)(const std::string&), const char* example) const;

  YAML::Node node_;
  std::string file_;
  std::string path_;
};

}  // namespace alloy
