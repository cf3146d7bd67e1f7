// Pre-tokenizer patterns: each splits tricky strings as Python's `regex` does with the literal
// pattern string (the expected pieces were produced by regex.findall).
#include "runtime/io/pretokenize.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace alloy {
namespace {

std::vector<std::string> pretokens_of(PretokenPattern pattern, std::string_view text) {
  std::vector<std::string> pieces;
  for (std::size_t pos = 0; pos < text.size();) {
    std::size_t end = pretoken_end(pattern, text, pos);
    EXPECT_GT(end, pos) << "no progress at byte " << pos;
    if (end <= pos) break;
    pieces.emplace_back(text.substr(pos, end - pos));
    pos = end;
  }
  return pieces;
}

using PretokenPieces = std::vector<std::string>;
constexpr PretokenPattern kGpt2 = PretokenPattern::PretokenPattern_gpt2;
constexpr PretokenPattern kLlama3 = PretokenPattern::PretokenPattern_llama3;
constexpr PretokenPattern kQwen2 = PretokenPattern::PretokenPattern_qwen2;

TEST(Pretokenize, WordsTakeTheSpaceBeforeThem) {
  for (PretokenPattern pattern : {kGpt2, kLlama3, kQwen2}) {
    EXPECT_EQ(pretokens_of(pattern, "Hello world"), (PretokenPieces{"Hello", " world"}));
    EXPECT_EQ(pretokens_of(pattern, "a   b"), (PretokenPieces{"a", "  ", " b"}));
    EXPECT_EQ(pretokens_of(pattern, "trailing  "), (PretokenPieces{"trailing", "  "}));
    EXPECT_EQ(pretokens_of(pattern, "x  \n"), (PretokenPieces{"x", "  \n"}));
    EXPECT_EQ(pretokens_of(pattern, " ?!"), (PretokenPieces{" ?!"}));
  }
}

TEST(Pretokenize, ContractionsAreCaseSensitiveOnlyInGpt2) {
  std::string text = "it's I'M you're WE'VE it'\xC5\xBF";  // U+017F long s folds to s
  EXPECT_EQ(pretokens_of(kGpt2, text),
            (PretokenPieces{"it", "'s", " I", "'", "M", " you", "'re", " WE", "'", "VE", " it", "'", "\xC5\xBF"}));
  PretokenPieces folded = {"it", "'s", " I", "'M", " you", "'re", " WE", "'VE", " it", "'\xC5\xBF"};
  EXPECT_EQ(pretokens_of(kLlama3, text), folded);
  EXPECT_EQ(pretokens_of(kQwen2, text), folded);
  EXPECT_EQ(pretokens_of(kGpt2, "'hello 'S"), (PretokenPieces{"'", "hello", " '", "S"}));
  EXPECT_EQ(pretokens_of(kLlama3, "'hello 'S"), (PretokenPieces{"'hello", " '", "S"}));
}

TEST(Pretokenize, DigitsGroupByPattern) {
  std::string text = "12345 678 x1234567";
  EXPECT_EQ(pretokens_of(kGpt2, text), (PretokenPieces{"12345", " 678", " x", "1234567"}));
  EXPECT_EQ(pretokens_of(kLlama3, text), (PretokenPieces{"123", "45", " ", "678", " x", "123", "456", "7"}));
  EXPECT_EQ(pretokens_of(kQwen2, "12 x123"), (PretokenPieces{"1", "2", " x", "1", "2", "3"}));
}

TEST(Pretokenize, NewlinesAndSpacesBeforeWords) {
  EXPECT_EQ(pretokens_of(kGpt2, "a\n\nb"), (PretokenPieces{"a", "\n", "\n", "b"}));
  EXPECT_EQ(pretokens_of(kLlama3, "a\n\nb"), (PretokenPieces{"a", "\n\n", "b"}));
  EXPECT_EQ(pretokens_of(kGpt2, "a \n\n  b"), (PretokenPieces{"a", " \n\n ", " b"}));
  EXPECT_EQ(pretokens_of(kLlama3, "a \n\n  b"), (PretokenPieces{"a", " \n\n", " ", " b"}));
  EXPECT_EQ(pretokens_of(kGpt2, "x!!\n\ny"), (PretokenPieces{"x", "!!", "\n", "\n", "y"}));
  EXPECT_EQ(pretokens_of(kQwen2, "x!!\n\ny"), (PretokenPieces{"x", "!!\n\n", "y"}));
  EXPECT_EQ(pretokens_of(kGpt2, "line\r\n\r\nnext"), (PretokenPieces{"line", "\r\n\r", "\n", "next"}));
  EXPECT_EQ(pretokens_of(kLlama3, "line\r\n\r\nnext"), (PretokenPieces{"line", "\r\n\r\n", "next"}));
  EXPECT_EQ(pretokens_of(kGpt2, "\thello  world"), (PretokenPieces{"\t", "hello", " ", " world"}));
  EXPECT_EQ(pretokens_of(kLlama3, "\thello  world"), (PretokenPieces{"\thello", " ", " world"}));
}

TEST(Pretokenize, UnicodeLettersNumbersAndSpaces) {
  std::string spaces =
      "a\xE3\x80\x80"
      "b c\xC2\xA0"
      "d";  // U+3000 ideographic space, U+00A0 no-break space
  EXPECT_EQ(pretokens_of(kGpt2, spaces), (PretokenPieces{"a", "\xE3\x80\x80", "b", " c", "\xC2\xA0", "d"}));
  EXPECT_EQ(pretokens_of(kLlama3, spaces), (PretokenPieces{"a",
                                                           "\xE3\x80\x80"
                                                           "b",
                                                           " c",
                                                           "\xC2\xA0"
                                                           "d"}));
  std::string cjk = "\xE6\x9D\xB1\xE4\xBA\xAC\xE3\x81\xAE\xE5\xA4\xA9\xE6\xB0\x97";  // 東京の天気
  EXPECT_EQ(pretokens_of(kGpt2, cjk + " 123"), (PretokenPieces{cjk, " 123"}));
  EXPECT_EQ(pretokens_of(kQwen2, cjk + " 123"), (PretokenPieces{cjk, " ", "1", "2", "3"}));
}

// Invalid UTF-8 (stray bytes, a truncated sequence) never stops the matcher: each bad byte is
// a symbol, neither letter, number nor space.
TEST(Pretokenize, InvalidUtf8BytesAreSymbols) {
  for (PretokenPattern pattern : {kGpt2, kLlama3, kQwen2}) {
    EXPECT_EQ(pretokens_of(pattern,
                           "ab\xFF\xFE"
                           "cd"),
              (PretokenPieces{"ab", "\xFF\xFE", "cd"}));
    EXPECT_EQ(pretokens_of(pattern, "a \xFF"), (PretokenPieces{"a", " \xFF"}));
    EXPECT_EQ(pretokens_of(pattern, "a\xE6\x97"), (PretokenPieces{"a", "\xE6\x97"}));
    EXPECT_EQ(pretokens_of(pattern, "\xC0\xAF!"), (PretokenPieces{"\xC0\xAF!"}));  // overlong '/'
  }
}

TEST(Pretokenize, PatternsAreRecognisedExactly) {
  for (PretokenPattern pattern : {kGpt2, kLlama3, kQwen2}) {
    EXPECT_EQ(pretoken_pattern_from_regex(pretoken_pattern_regex(pattern)), pattern);
  }
  std::string almost(pretoken_pattern_regex(kGpt2));
  almost += "|x";
  EXPECT_FALSE(pretoken_pattern_from_regex(almost).has_value());
  EXPECT_FALSE(pretoken_pattern_from_regex(R"(\w+|\s+)").has_value());
}

}  // namespace
}  // namespace alloy
