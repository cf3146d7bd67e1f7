// UTF-8 decoding, character classes and NFC for the BPE pre-tokenizer (see unicode_text.hpp).
#include "runtime/io/unicode_text.hpp"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>

#include <array>

#include "spec/error.hpp"

namespace alloy {

namespace {

// ASCII is most of most text: its classes come from a table, the rest from ICU.
constexpr std::array<CharClass, 128> ascii_classes() {
  std::array<CharClass, 128> classes{};
  for (std::size_t c = 0; c < 128; ++c) {
    bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    bool number = c >= '0' && c <= '9';
    bool space = c == ' ' || (c >= '\t' && c <= '\r');  // \t \n \v \f \r: White_Space
    classes[c] = letter   ? CharClass::CharClass_letter
                 : number ? CharClass::CharClass_number
                 : space  ? CharClass::CharClass_space
                          : CharClass::CharClass_symbol;
  }
  return classes;
}

constexpr std::array<CharClass, 128> kAsciiClasses = ascii_classes();

CharClass char_class_of(char32_t value) {
  if (value < 128) return kAsciiClasses[value];
  auto icu_value = static_cast<UChar32>(value);
  switch (u_charType(icu_value)) {
    case U_UPPERCASE_LETTER:
    case U_LOWERCASE_LETTER:
    case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
      return CharClass::CharClass_letter;
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER:
      return CharClass::CharClass_number;
    default:
      return u_isUWhiteSpace(icu_value) ? CharClass::CharClass_space : CharClass::CharClass_symbol;
  }
}

bool is_continuation(unsigned char byte) { return (byte & 0xC0) == 0x80; }

// The code point of the well-formed sequence at `pos`, or kInvalidCodePoint; sets `length`.
char32_t utf8_decode(std::string_view text, std::size_t pos, std::size_t& length) {
  auto lead = static_cast<unsigned char>(text[pos]);
  length = 1;
  if (lead < 0x80) return lead;
  std::size_t extra = lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : lead >= 0xC0 ? 1 : 0;
  if (extra == 0 || lead > 0xF4 || pos + extra >= text.size()) return kInvalidCodePoint;
  char32_t value = lead & (0x3F >> extra);
  for (std::size_t k = 1; k <= extra; ++k) {
    auto byte = static_cast<unsigned char>(text[pos + k]);
    if (!is_continuation(byte)) return kInvalidCodePoint;
    value = (value << 6) | (byte & 0x3F);
  }
  constexpr char32_t kSmallestOfLength[4] = {0, 0x80, 0x800, 0x10000};
  bool overlong = value < kSmallestOfLength[extra];
  bool surrogate = value >= 0xD800 && value <= 0xDFFF;
  if (overlong || surrogate || value > 0x10FFFF) return kInvalidCodePoint;
  length = extra + 1;
  return value;
}

const icu::Normalizer2& nfc_normalizer() {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = icu::Normalizer2::getNFCInstance(status);
  if (U_FAILURE(status) || normalizer == nullptr) {
    throw Error(std::string("ICU's NFC data is unavailable: ") + u_errorName(status), {},
                "reinstall libicu (scripts/install-deps.sh)");
  }
  return *normalizer;
}

}  // namespace

CodePoint code_point_at(std::string_view text, std::size_t pos) {
  CodePoint point;
  if (pos >= text.size()) return point;
  point.value = utf8_decode(text, pos, point.length_bytes);
  if (point.value != kInvalidCodePoint) point.char_class = char_class_of(point.value);
  return point;
}

bool text_is_nfc(std::string_view text) {
  UErrorCode status = U_ZERO_ERROR;
  bool normalized =
      nfc_normalizer().isNormalizedUTF8(icu::StringPiece(text.data(), static_cast<std::int32_t>(text.size())), status);
  return U_SUCCESS(status) && normalized;
}

std::string text_to_nfc(std::string_view text) {
  std::string normalized;
  normalized.reserve(text.size());
  icu::StringByteSink<std::string> sink(&normalized);
  UErrorCode status = U_ZERO_ERROR;
  nfc_normalizer().normalizeUTF8(0, icu::StringPiece(text.data(), static_cast<std::int32_t>(text.size())), sink,
                                 nullptr, status);
  if (U_FAILURE(status)) {
    throw Error(std::string("NFC normalization failed: ") + u_errorName(status), {},
                "split the input into smaller files (ICU takes at most 2 GiB at once)");
  }
  return normalized;
}

}  // namespace alloy
