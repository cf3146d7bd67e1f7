#include "util/table.hpp"

#include <algorithm>

namespace alloy {

namespace {
// Display width of UTF-8 text: count code points, not bytes.
size_t display_width(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}
}  // namespace

TextTable::TextTable(std::vector<std::string> headers) {
  for (auto& h : headers) {
    bool right = !h.empty() && h.back() == '>';
    if (right) h.pop_back();
    align_.push_back(right ? Align::Align_right : Align::Align_left);
    headers_.push_back(std::move(h));
  }
}

void TextTable::add_row(std::vector<std::string> cells) {
  cells.resize(headers_.size());
  rows_.push_back(std::move(cells));
}

std::string TextTable::render(int indent) const {
  std::vector<size_t> width(headers_.size(), 0);
  for (size_t c = 0; c < headers_.size(); ++c) width[c] = display_width(headers_[c]);
  for (const auto& row : rows_)
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], display_width(row[c]));

  auto line = [&](const std::vector<std::string>& cells) {
    std::string out(static_cast<size_t>(indent), ' ');
    for (size_t c = 0; c < cells.size(); ++c) {
      std::string pad(width[c] - display_width(cells[c]), ' ');
      bool last = c + 1 == cells.size();
      if (align_[c] == Align::Align_right) {
        out += pad + cells[c];
      } else {
        out += cells[c];
        if (!last) out += pad;
      }
      if (!last) out += "  ";
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out + "\n";
  };
  std::string out = line(headers_);
  std::vector<std::string> rule;
  for (size_t c = 0; c < headers_.size(); ++c) rule.push_back(std::string(width[c], '-'));
  out += line(rule);
  for (const auto& row : rows_) out += line(row);
  return out;
}

std::string text_thousands(long long value) {
  std::string digits = std::to_string(value < 0 ? -value : value);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return value < 0 ? "-" + out : out;
}

}  // namespace alloy
