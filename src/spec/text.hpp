// Small text helpers for messages: edit distance and "did you mean" suggestions.
#pragma once

#include <string>
#include <vector>

namespace alloy {

int text_edit_distance(const std::string& a, const std::string& b);
// The candidate closest to `word` by edit distance ("" when there are none).
std::string text_nearest(const std::string& word, const std::vector<std::string>& candidates);
std::string text_lower(std::string s);

}  // namespace alloy
