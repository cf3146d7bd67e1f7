#include "spec/field_reader.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "spec/json_unique.hpp"
#include "spec/text.hpp"
#include "spec/units.hpp"

namespace alloy {

std::string spec_file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw Error("cannot open file: it does not exist or is not readable", {path, "", 0, 0},
                "check the path, or pass a preset name (see `alloy check --help`)");
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::string yaml_quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

namespace {


// Line and column (1-based) of a byte offset.
void offset_to_line_column(const std::string& text, size_t offset, int* line, int* column) {
  *line = 1;
  *column = 1;
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++*line;
      *column = 1;
    } else {
      ++*column;
    }
  }
}

YAML::Node json_to_yaml(const nlohmann::json& j) {
  YAML::Node out;
  switch (j.type()) {
    case nlohmann::json::value_t::object:
      out = YAML::Node(YAML::NodeType::Map);
      for (const auto& [key, value] : j.items()) out[key] = json_to_yaml(value);
      break;
    case nlohmann::json::value_t::array:
      out = YAML::Node(YAML::NodeType::Sequence);
      for (const auto& value : j) out.push_back(json_to_yaml(value));
      break;
    case nlohmann::json::value_t::null: out = YAML::Node(YAML::NodeType::Null); break;
    case nlohmann::json::value_t::string: out = j.get<std::string>(); break;
    case nlohmann::json::value_t::boolean: out = j.get<bool>(); break;
    case nlohmann::json::value_t::number_integer: out = j.get<int64_t>(); break;
    case nlohmann::json::value_t::number_unsigned: out = j.get<uint64_t>(); break;
    case nlohmann::json::value_t::number_float: {
      std::ostringstream s;
      s.precision(17);
      s << j.get<double>();
      out = s.str();
      break;
    }
    default: out = YAML::Node(YAML::NodeType::Null); break;
  }
  return out;
}

// YAML forbids a key twice in one mapping, but yaml-cpp keeps the first value without a word: a
// hand-edited `steps: 7` below `steps: 200` would be ignored. Refused, naming both lines.
void yaml_check_unique_keys(const YAML::Node& node, const std::string& path) {
  if (node.IsSequence()) {
    for (const YAML::Node& item : node) yaml_check_unique_keys(item, path);
    return;
  }
  if (!node.IsMap()) return;
  std::map<std::string, int> first_line;  // key -> the line (1-based) where it first appears
  for (const auto& entry : node) {
    const YAML::Node& key = entry.first;
    if (key.IsScalar()) {
      const auto [seen, fresh] = first_line.emplace(key.Scalar(), key.Mark().line + 1);
      if (!fresh)
        throw Error(fmt::format("'{}' is given twice in one mapping (first on line {})", key.Scalar(), seen->second),
                    {path, key.Scalar(), key.Mark().line + 1, key.Mark().column + 1}, "keep one of the two");
    }
    yaml_check_unique_keys(entry.second, path);
  }
}

std::string describe_scalar(const YAML::Node& n) {
  if (n.IsScalar()) return "'" + n.Scalar() + "'";
  if (n.IsMap()) return "a mapping";
  if (n.IsSequence()) return "a list";
  return "nothing";
}

}  // namespace

YAML::Node spec_text_parse(const std::string& text, const std::string& path, bool is_json) {
  if (is_json) {
    nlohmann::json j;
    try {
      j = json_parse_unique_keys<nlohmann::json>(text, path);
    } catch (const nlohmann::json::parse_error& e) {
      int line = 0, column = 0;
      offset_to_line_column(text, e.byte > 0 ? e.byte - 1 : 0, &line, &column);
      std::string detail = e.what();
      size_t cut = detail.find("syntax error");
      throw Error("malformed JSON: " + (cut == std::string::npos ? detail : detail.substr(cut)),
                  {path, "", line, column}, "fix the JSON syntax at that position");
    } catch (const nlohmann::json::out_of_range& e) {  // a number too large for a double
      std::string detail = e.what();
      size_t cut = detail.find("number overflow");
      throw Error("unreadable JSON: " + (cut == std::string::npos ? detail : detail.substr(cut)), {path, ""},
                  "write numbers a double can hold");
    }
    if (!j.is_object()) throw Error("the file must hold a JSON object", {path, "", 1, 1}, "wrap the fields in { }");
    return json_to_yaml(j);
  }
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw Error("malformed YAML: " + e.msg, {path, "", e.mark.line + 1, e.mark.column + 1},
                "fix the YAML syntax at that position (indentation, colons, quotes)");
  }
  yaml_check_unique_keys(root, path);
  if (!root.IsMap()) {
    throw Error("the file must hold a YAML mapping of fields (key: value)", {path, "", 1, 1},
                "see the examples under examples/ for the expected layout");
  }
  return root;
}

YAML::Node spec_file_parse(const std::string& path) {
  return spec_text_parse(spec_file_text(path), path, path.ends_with(".json"));
}

FieldReader::FieldReader(YAML::Node node, std::string file, std::string path)
    : node_(std::move(node)), file_(std::move(file)), path_(std::move(path)) {}

std::string FieldReader::field_path(const std::string& key) const {
  if (key.empty()) return path_;
  if (path_.empty()) return key;
  return path_ + "." + key;
}

ErrorWhere FieldReader::where(const std::string& key) const {
  ErrorWhere w{file_, field_path(key), 0, 0};
  YAML::Node n = (key.empty() || !has(key)) ? node_ : YAML::Node(node_[key]);
  YAML::Mark mark = n.IsDefined() ? n.Mark() : YAML::Mark::null_mark();
  if (mark.line >= 0 && !mark.is_null()) {
    w.line = mark.line + 1;
    w.column = mark.column + 1;
  }
  return w;
}

void FieldReader::fail(const std::string& key, const std::string& what, const std::string& hint) const {
  throw Error(what, where(key), hint);
}

bool FieldReader::has(const std::string& key) const {
  return node_.IsMap() && node_[key].IsDefined();
}

bool FieldReader::is_null(const std::string& key) const {
  return !has(key) || node_[key].IsNull();
}

YAML::Node FieldReader::value(const std::string& key) const {
  if (is_null(key)) fail(key, "required field is missing", "add `" + key + ": <value>`");
  YAML::Node n = node_[key];
  if (!n.IsScalar()) fail(key, "expected a single value, found " + describe_scalar(n), "write `" + key + ": <value>`");
  return n;
}

int64_t FieldReader::get_int(const std::string& key) const {
  YAML::Node n = value(key);
  const std::string& text = n.Scalar();
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) {
    // Accept whole numbers written as floats ("4096.0", "1e3") when exact.
    double d = 0;
    try {
      d = std::stod(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != text.size() || !std::isfinite(d) || d != std::floor(d) || std::abs(d) > 9e18) {
      fail(key, "expected a whole number, got " + describe_scalar(n), "write an integer such as 4096");
    }
    v = static_cast<long long>(d);
  }
  return v;
}

int64_t FieldReader::get_int(const std::string& key, int64_t fallback) const {
  return is_null(key) ? fallback : get_int(key);
}

double FieldReader::get_double(const std::string& key) const {
  YAML::Node n = value(key);
  size_t used = 0;
  double d = 0;
  try {
    d = std::stod(n.Scalar(), &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != n.Scalar().size() || !std::isfinite(d)) {
    fail(key, "expected a number, got " + describe_scalar(n), "write a number such as 1e-5");
  }
  return d;
}

double FieldReader::get_double(const std::string& key, double fallback) const {
  return is_null(key) ? fallback : get_double(key);
}

bool FieldReader::get_bool(const std::string& key, bool fallback) const {
  if (is_null(key)) return fallback;
  YAML::Node n = value(key);
  const std::string& t = n.Scalar();
  if (t == "true" || t == "True" || t == "yes") return true;
  if (t == "false" || t == "False" || t == "no") return false;
  fail(key, "expected true or false, got " + describe_scalar(n), "write `" + key + ": true` or `false`");
}

std::string FieldReader::get_string(const std::string& key) const { return value(key).Scalar(); }

std::string FieldReader::get_string(const std::string& key, const std::string& fallback) const {
  return is_null(key) ? fallback : get_string(key);
}

double FieldReader::get_quantity(const std::string& key, std::optional<double> fallback,
                                 std::optional<double> (*parse)(const std::string&),
                                 const char* example) const {
  if (is_null(key) && fallback) return *fallback;
  YAML::Node n = value(key);
  std::optional<double> v = parse(n.Scalar());
  if (!v) {
    fail(key, "cannot read " + describe_scalar(n) + " as a non-negative quantity with a unit",
         std::string("write it like `") + key + ": " + example + "`");
  }
  return *v;
}

double FieldReader::get_bytes(const std::string& key, std::optional<double> fallback) const {
  return get_quantity(key, fallback, units_parse_bytes, "80GiB");
}
double FieldReader::get_bandwidth(const std::string& key, std::optional<double> fallback) const {
  return get_quantity(key, fallback, units_parse_bandwidth, "300GB/s");
}
double FieldReader::get_seconds(const std::string& key, std::optional<double> fallback) const {
  return get_quantity(key, fallback, units_parse_seconds, "5us");
}
double FieldReader::get_flops(const std::string& key, std::optional<double> fallback) const {
  return get_quantity(key, fallback, units_parse_flops, "312TFLOPS");
}

FieldReader FieldReader::child(const std::string& key) const {
  if (!has(key) || !node_[key].IsMap()) {
    fail(key, has(key) ? "expected a mapping of fields" : "required section is missing",
         "write `" + key + ":` followed by indented `name: value` lines");
  }
  return FieldReader(node_[key], file_, field_path(key));
}

size_t FieldReader::list_size(const std::string& key) const {
  if (!has(key) || !node_[key].IsSequence()) {
    fail(key, has(key) ? "expected a list" : "required list is missing", "write `" + key + ": [...]`");
  }
  return node_[key].size();
}

std::vector<FieldReader> FieldReader::list(const std::string& key) const {
  if (!has(key) || !node_[key].IsSequence()) {
    fail(key, has(key) ? "expected a list" : "required list is missing",
         "write `" + key + ":` followed by `- ` items");
  }
  std::vector<FieldReader> out;
  YAML::Node seq = node_[key];
  for (size_t i = 0; i < seq.size(); ++i) {
    std::string item_path = field_path(key) + "[" + std::to_string(i) + "]";
    if (!seq[i].IsMap()) {
      FieldReader item(seq[i], file_, item_path);
      item.fail("", "expected a mapping of fields in this list item", "write `- name: value` items");
    }
    out.emplace_back(seq[i], file_, item_path);
  }
  return out;
}

std::vector<std::string> FieldReader::keys() const {
  std::vector<std::string> out;
  if (!node_.IsMap()) return out;
  for (const auto& kv : node_) {
    if (kv.first.IsScalar()) out.push_back(kv.first.Scalar());
  }
  return out;
}

void FieldReader::reject_unknown(std::initializer_list<const char*> known) const {
  std::vector<std::string> names(known.begin(), known.end());
  if (!node_.IsMap()) return;
  for (const auto& kv : node_) {
    if (!kv.first.IsScalar()) fail("", "a key must be a plain name", "write `name: value`");
    const std::string& key = kv.first.Scalar();
    if (std::find(names.begin(), names.end(), key) == names.end()) {
      fail(key, "unknown field", "did you mean `" + text_nearest(key, names) + "`? remove or rename it");
    }
  }
}

}  // namespace alloy
