// UTF-8 decoding and the Unicode classes the BPE pre-tokenizer patterns ask about (\p{L},
// \p{N}, \s), plus NFC normalization; the character data comes from ICU.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace alloy {

// How the pre-tokenizer patterns see a code point. `\s` is Unicode's White_Space property,
// `\p{L}` the general categories Lu Ll Lt Lm Lo and `\p{N}` Nd Nl No, as in Python's `regex`.
// A byte that does not start a valid UTF-8 sequence is a symbol: neither letter, number nor
// space, so byte-level BPE still encodes it.
enum class CharClass : unsigned char {
  CharClass_letter,
  CharClass_number,
  CharClass_space,
  CharClass_symbol,
};

inline constexpr char32_t kInvalidCodePoint = 0xFFFFFFFF;

struct CodePoint {
  char32_t value = kInvalidCodePoint;  // kInvalidCodePoint for a byte of invalid UTF-8
  CharClass char_class = CharClass::CharClass_symbol;
  std::size_t length_bytes = 0;  // 0 only at the end of the text
};

// The code point starting at `pos`; an invalid, overlong, surrogate or truncated sequence is
// one byte of class symbol. At or past the end: length_bytes 0.
CodePoint code_point_at(std::string_view text, std::size_t pos);

// Whether `text` is already in Normalization Form C (invalid UTF-8 bytes are left as they are).
bool text_is_nfc(std::string_view text);
// `text` in Normalization Form C; invalid UTF-8 bytes pass through unchanged.
std::string text_to_nfc(std::string_view text);

}  // namespace alloy
