// Where shipped examples live, so users can say `--model llama-2-7b` instead of a path.
#pragma once

#include <string>
#include <vector>

namespace alloy {

// The examples folder: $ALLOY_EXAMPLES, else <binary>/../examples, else the source tree's.
std::string presets_examples_dir();

// Path of examples/<kind>/<name>.{json,yaml,yml}, or "" when there is none.
std::string presets_find(const std::string& kind, const std::string& name);

// Names (file stems) of examples/<kind>/*, sorted.
std::vector<std::string> presets_list(const std::string& kind);

// True when `text` looks like a path rather than a preset name.
bool presets_is_path(const std::string& text);

}  // namespace alloy
