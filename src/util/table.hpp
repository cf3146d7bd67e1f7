// Aligned text tables for people: a header row, data rows, columns padded to their widest cell.
#pragma once

#include <string>
#include <vector>

namespace alloy {

class TextTable {
 public:
  enum class Align { Align_left, Align_right };

  // One entry per column; columns whose header ends in '>' are right-aligned (the '>' is dropped).
  explicit TextTable(std::vector<std::string> headers);
  void add_row(std::vector<std::string> cells);
  // Renders with `indent` spaces before each line and two spaces between columns.
  std::string render(int indent = 2) const;

 private:
  std::vector<std::string> headers_;
  std::vector<Align> align_;
  std::vector<std::vector<std::string>> rows_;
};

// 6738415616 -> "6,738,415,616"
std::string text_thousands(long long value);

}  // namespace alloy
