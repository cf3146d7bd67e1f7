// JSON parsing that refuses a key given twice in one object. nlohmann::json keeps one of the
// values without a word, so a hand-edited file whose second `"layers": 48` is ignored would
// silently describe another model.
#pragma once

#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "spec/error.hpp"

namespace alloy {

// Parses `text` as `Json` (nlohmann::json or ordered_json); throws Error naming `source` and the
// repeated key. Syntax errors are thrown as the library's parse_error, for the caller to word.
template <class Json>
Json json_parse_unique_keys(const std::string& text, const std::string& source) {
  std::vector<std::set<std::string>> open_objects;  // the keys seen so far in each enclosing object
  typename Json::parser_callback_t on_event = [&](int, typename Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == Json::parse_event_t::object_end) {
      open_objects.pop_back();
    } else if (event == Json::parse_event_t::key && !open_objects.empty()) {
      const std::string key = parsed.template get<std::string>();
      if (!open_objects.back().insert(key).second)
        throw Error(fmt::format("the key '{}' is given twice in one object", key), {source, key},
                    "keep one of the two; JSON readers disagree on which one wins");
    }
    return true;
  };
  return Json::parse(text, on_event);
}

}  // namespace alloy
