#include "spec/presets.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>

namespace alloy {

namespace fs = std::filesystem;

namespace {
const char* kExtensions[] = {".json", ".yaml", ".yml"};
}

std::string presets_examples_dir() {
  if (const char* env = std::getenv("ALLOY_EXAMPLES"); env && *env) return env;
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (fs::path dir = self.parent_path(); !dir.empty() && dir != dir.root_path(); dir = dir.parent_path()) {
      if (fs::is_directory(dir / "examples" / "models", ec)) return (dir / "examples").string();
    }
  }
  return std::string(ALLOY_SOURCE_DIR) + "/examples";
}

std::string presets_find(const std::string& kind, const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos) return "";
  fs::path dir = fs::path(presets_examples_dir()) / kind;
  std::error_code ec;
  for (const char* ext : kExtensions) {
    fs::path candidate = dir / (name + ext);
    if (fs::is_regular_file(candidate, ec)) return candidate.string();
  }
  return "";
}

std::vector<std::string> presets_list(const std::string& kind) {
  std::set<std::string> names;
  std::error_code ec;
  fs::path dir = fs::path(presets_examples_dir()) / kind;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string ext = it->path().extension().string();
    if (std::find(std::begin(kExtensions), std::end(kExtensions), ext) != std::end(kExtensions)) {
      names.insert(it->path().stem().string());
    }
  }
  return {names.begin(), names.end()};
}

bool presets_is_path(const std::string& text) {
  if (text.find('/') != std::string::npos) return true;
  for (const char* ext : kExtensions) {
    std::string e(ext);
    if (text.size() > e.size() && text.compare(text.size() - e.size(), e.size(), e) == 0) return true;
  }
  return false;
}

}  // namespace alloy
