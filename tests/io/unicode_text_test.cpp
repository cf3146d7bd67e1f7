// UTF-8 decoding and character classes as the pre-tokenizer patterns see them (Python regex's
// \p{L}, \p{N}, \s), invalid sequences as one-byte symbols, and NFC.
#include "runtime/io/unicode_text.hpp"

#include <gtest/gtest.h>

namespace alloy {
namespace {

CharClass class_of(std::string_view text) { return code_point_at(text, 0).char_class; }

TEST(UnicodeText, ClassesFollowPythonRegex) {
  EXPECT_EQ(class_of("\xC3\xA9"), CharClass::CharClass_letter);      // é
  EXPECT_EQ(class_of("\xE6\x9D\xB1"), CharClass::CharClass_letter);  // 東
  EXPECT_EQ(class_of("\xD9\xA3"), CharClass::CharClass_number);      // Arabic-Indic three
  EXPECT_EQ(class_of("\xE2\x85\xAB"), CharClass::CharClass_number);  // Roman numeral twelve (Nl)
  EXPECT_EQ(class_of("\xC2\xBD"), CharClass::CharClass_number);      // ½ (No)
  EXPECT_EQ(class_of("\xC2\x85"), CharClass::CharClass_space);       // NEL
  EXPECT_EQ(class_of("\xC2\xA0"), CharClass::CharClass_space);       // no-break space
  EXPECT_EQ(class_of("\xE3\x80\x80"), CharClass::CharClass_space);   // ideographic space
  EXPECT_EQ(class_of("\x0B"), CharClass::CharClass_space);
  EXPECT_EQ(class_of("\x1C"), CharClass::CharClass_symbol) << "Python's str.isspace says yes, regex's \\s no";
  EXPECT_EQ(class_of("\xE2\x80\x8D"), CharClass::CharClass_symbol);      // zero-width joiner
  EXPECT_EQ(class_of("\xF0\x9F\x98\x80"), CharClass::CharClass_symbol);  // 😀
  CodePoint emoji = code_point_at("\xF0\x9F\x98\x80", 0);
  EXPECT_EQ(emoji.value, 0x1F600u);
  EXPECT_EQ(emoji.length_bytes, 4u);
}

TEST(UnicodeText, InvalidSequencesAreOneByteSymbols) {
  for (std::string_view bad :
       {std::string_view("\xFF"), std::string_view("\x80"), std::string_view("\xC0\xAF"),
        std::string_view("\xED\xA0\x80"), std::string_view("\xF4\x90\x80\x80"), std::string_view("\xE6\x97")}) {
    CodePoint point = code_point_at(bad, 0);
    EXPECT_EQ(point.value, kInvalidCodePoint);
    EXPECT_EQ(point.length_bytes, 1u);
    EXPECT_EQ(point.char_class, CharClass::CharClass_symbol);
  }
  EXPECT_EQ(code_point_at("a", 1).length_bytes, 0u);
}

TEST(UnicodeText, NfcComposesAndKeepsInvalidBytes) {
  EXPECT_TRUE(text_is_nfc("caf\xC3\xA9"));
  EXPECT_FALSE(text_is_nfc("cafe\xCC\x81"));
  EXPECT_EQ(text_to_nfc("cafe\xCC\x81 \xFF"), "caf\xC3\xA9 \xFF");
}

}  // namespace
}  // namespace alloy
