// Hand-written matchers for the three supported pre-tokenizer regexes (see pretokenize.hpp).
// Each follows the regex's alternatives in order, with the backtracking worked out by hand:
// the comments give the alternative each branch stands for.
#include "runtime/io/pretokenize.hpp"

#include "runtime/io/unicode_text.hpp"

namespace alloy {

namespace {

constexpr std::string_view kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

bool is_line_break(char32_t value) { return value == '\r' || value == '\n'; }

// Whether the byte at `pos` is the ASCII letter `lower`, or with `ignore_case` its upper case.
bool contraction_letter(std::string_view text, std::size_t pos, char lower, bool ignore_case) {
  if (pos >= text.size()) return false;
  char c = text[pos];
  return c == lower || (ignore_case && c == lower - 'a' + 'A');
}

// Bytes of the contraction ('s 't 're 've 'm 'll 'd) at `begin`, which holds an apostrophe; 0
// when there is none. Case-insensitively, Python's `regex` also lets U+017F (long s, which
// case-folds to s) stand for s.
std::size_t contraction_length(std::string_view text, std::size_t begin, bool ignore_case) {
  std::size_t next = begin + 1;
  for (char single : {'s', 't', 'm', 'd'}) {
    if (contraction_letter(text, next, single, ignore_case)) return 2;
  }
  if (ignore_case && text.substr(next, 2) == "\xC5\xBF") return 3;
  for (std::string_view pair : {"re", "ve", "ll"}) {
    if (contraction_letter(text, next, pair[0], ignore_case) &&
        contraction_letter(text, next + 1, pair[1], ignore_case)) {
      return 3;
    }
  }
  return 0;
}

// End of the run of code points of class `char_class` from `begin`, at most `most` of them.
std::size_t class_run_end(std::string_view text, std::size_t begin, CharClass char_class,
                          std::size_t most = std::string_view::npos) {
  std::size_t pos = begin;
  for (std::size_t count = 0; count < most; ++count) {
    CodePoint point = code_point_at(text, pos);
    if (point.length_bytes == 0 || point.char_class != char_class) break;
    pos += point.length_bytes;
  }
  return pos;
}

// `\s+(?!\S)|\s+` at a space: the whole run of spaces when it ends the text, else the run but
// its last code point (which then prefixes the word after it), but never less than one.
std::size_t spaces_end(std::string_view text, std::size_t begin) {
  std::size_t pos = begin;
  std::size_t last_start = begin;
  for (;;) {
    CodePoint point = code_point_at(text, pos);
    if (point.length_bytes == 0 || point.char_class != CharClass::CharClass_space) break;
    last_start = pos;
    pos += point.length_bytes;
  }
  if (pos == text.size() || last_start == begin) return pos;
  return last_start;
}

std::size_t gpt2_pretoken_end(std::string_view text, std::size_t begin) {
  CodePoint first = code_point_at(text, begin);
  if (first.value == '\'') {
    std::size_t length = contraction_length(text, begin, false);
    if (length > 0) return begin + length;
  }
  // ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+`: a space joins the run of any class but space after it.
  std::size_t run_begin = begin;
  if (first.value == ' ') {
    CodePoint next = code_point_at(text, begin + 1);
    if (next.length_bytes > 0 && next.char_class != CharClass::CharClass_space) run_begin = begin + 1;
  }
  CodePoint run_first = code_point_at(text, run_begin);
  if (run_first.char_class != CharClass::CharClass_space) {
    return class_run_end(text, run_begin, run_first.char_class);
  }
  return spaces_end(text, begin);
}

// `\s*[\r\n]+` at a space: through the last line break of the run of spaces, or 0 when the run
// has none.
std::size_t spaces_to_line_break_end(std::string_view text, std::size_t begin) {
  std::size_t end = 0;
  std::size_t pos = begin;
  for (;;) {
    CodePoint point = code_point_at(text, pos);
    if (point.length_bytes == 0 || point.char_class != CharClass::CharClass_space) break;
    pos += point.length_bytes;
    if (is_line_break(point.value)) end = pos;
  }
  return end;
}

std::size_t llama3_pretoken_end(std::string_view text, std::size_t begin, std::size_t most_digits) {
  CodePoint first = code_point_at(text, begin);
  if (first.value == '\'') {
    std::size_t length = contraction_length(text, begin, true);
    if (length > 0) return begin + length;
  }
  // `[^\r\n\p{L}\p{N}]?\p{L}+`
  if (first.char_class == CharClass::CharClass_letter) return class_run_end(text, begin, first.char_class);
  std::size_t second = begin + first.length_bytes;
  CodePoint next = code_point_at(text, second);
  bool may_prefix = first.char_class != CharClass::CharClass_number && !is_line_break(first.value);
  if (may_prefix && next.char_class == CharClass::CharClass_letter) {
    return class_run_end(text, second, CharClass::CharClass_letter);
  }
  // `\p{N}{1,3}` (Llama 3) or `\p{N}` (Qwen2)
  if (first.char_class == CharClass::CharClass_number) {
    return class_run_end(text, begin, CharClass::CharClass_number, most_digits);
  }
  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
  std::size_t symbols_begin = begin;
  if (first.value == ' ' && next.length_bytes > 0 && next.char_class == CharClass::CharClass_symbol) {
    symbols_begin = second;
  }
  if (code_point_at(text, symbols_begin).char_class == CharClass::CharClass_symbol) {
    std::size_t end = class_run_end(text, symbols_begin, CharClass::CharClass_symbol);
    while (end < text.size() && is_line_break(static_cast<unsigned char>(text[end]))) ++end;
    return end;
  }
  // `\s*[\r\n]+`, then `\s+(?!\S)|\s+`
  std::size_t line_break_end = spaces_to_line_break_end(text, begin);
  if (line_break_end > 0) return line_break_end;
  return spaces_end(text, begin);
}

}  // namespace

std::string_view pretoken_pattern_regex(PretokenPattern pattern) {
  switch (pattern) {
    case PretokenPattern::PretokenPattern_gpt2:
      return kGpt2Regex;
    case PretokenPattern::PretokenPattern_llama3:
      return kLlama3Regex;
    case PretokenPattern::PretokenPattern_qwen2:
      return kQwen2Regex;
  }
  return {};
}

std::optional<PretokenPattern> pretoken_pattern_from_regex(std::string_view regex) {
  for (PretokenPattern pattern : {PretokenPattern::PretokenPattern_gpt2, PretokenPattern::PretokenPattern_llama3,
                                  PretokenPattern::PretokenPattern_qwen2}) {
    if (regex == pretoken_pattern_regex(pattern)) return pattern;
  }
  return std::nullopt;
}

std::string pretoken_pattern_names() { return "GPT-2, Llama 3, Qwen2"; }

std::size_t pretoken_end(PretokenPattern pattern, std::string_view text, std::size_t begin) {
  switch (pattern) {
    case PretokenPattern::PretokenPattern_gpt2:
      return gpt2_pretoken_end(text, begin);
    case PretokenPattern::PretokenPattern_llama3:
      return llama3_pretoken_end(text, begin, 3);
    case PretokenPattern::PretokenPattern_qwen2:
      return llama3_pretoken_end(text, begin, 1);
  }
  return text.size();
}

}  // namespace alloy
