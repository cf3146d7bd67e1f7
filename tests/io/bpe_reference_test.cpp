// `alloy tokenize --tokenizer` against an independent Python reference (tests/io/bpe/
// reference_bpe.py: Python's `regex` with the literal pattern strings, its own BPE), token for
// token on about 3 MB of shuffled example text and non-ASCII lines, and on a random mix of
// tricky pieces, for each family's fixture.
#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>

#include "io_test_util.hpp"
#include "runtime/io/token_file.hpp"

namespace alloy {
namespace {

constexpr std::size_t kReferenceTextBytes = 3'000'000;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::size_t begin = 0;
  for (std::size_t end = text.find('\n'); end != std::string::npos; end = text.find('\n', begin)) {
    lines.push_back(text.substr(begin, end + 1 - begin));
    begin = end + 1;
  }
  if (begin < text.size()) lines.push_back(text.substr(begin));
  return lines;
}

// Lines of the example text (4 in 5) and of the non-ASCII lines, drawn with a fixed seed, with
// an "<|endoftext|>" between documents now and then.
std::string reference_text() {
  const std::string source = ALLOY_SOURCE_DIR;
  std::vector<std::string> english = lines_of(test::bytes_read(source + "/examples/data/fsf_licenses.txt"));
  std::vector<std::string> unicode = lines_of(test::bytes_read(source + "/tests/io/bpe/unicode_lines.txt"));
  std::mt19937 random(2026);
  std::string text;
  while (text.size() < kReferenceTextBytes) {
    const std::vector<std::string>& lines = random() % 5 == 0 ? unicode : english;
    text += lines[random() % lines.size()];
    if (random() % 50 == 0) text += "<|endoftext|>";
  }
  return text;
}

// Pieces drawn at random from the strings the patterns treat differently: letters, numbers
// and spaces of several scripts and kinds, CR and LF, contraction parts in both cases, symbols,
// combining marks and an added token and a prefix of it. The prose above never puts, say, a
// no-break space before an apostrophe; this does.
std::string tricky_text() {
  // clang-format off
  const std::vector<std::string> pieces = {
      "a", "Z", "ab", "\xC3\xA9", "\xE6\x9D\xB1", "e\xCC\x81",                         // letters, a combining mark
      "1", "0", "99", "\xD9\xA3", "\xC2\xBD",                                          // numbers
      " ", " ", " ", "\t", "\n", "\r", "\r\n", "\xC2\xA0", "\xE3\x80\x80", "\xC2\x85", "\x0B",  // spaces
      "'", "s", "S", "\xC5\xBF", "t", "re", "VE", "ll", "M", "d",                      // contraction parts
      "!", "?", ".", "-", "_", "\x1C", "\xF0\x9F\x98\x80", "\xE2\x80\x8D",                 // symbols
      "<|endoftext|>", "<|end"};                                                      // added tokens
  // clang-format on
  std::mt19937 random(7);
  std::string text;
  for (int i = 0; i < 300000; ++i) text += pieces[random() % pieces.size()];
  return text;
}

std::vector<std::uint32_t> u32_read(const std::string& path) {
  std::string bytes = test::bytes_read(path);
  std::vector<std::uint32_t> ids(bytes.size() / 4);
  std::memcpy(ids.data(), bytes.data(), ids.size() * 4);
  return ids;
}

void reference_agrees(const std::string& family, const std::string& text) {
  if (!std::filesystem::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
  test::ScratchDir dir;
  const std::string tokenizer = std::string(ALLOY_TEST_DIR) + "/bpe/" + family + "_tokenizer.json";
  test::bytes_write(dir.file("text.txt"), text);
  std::string reference = "/usr/bin/python3 " + std::string(ALLOY_TEST_DIR) + "/bpe/reference_bpe.py " + tokenizer +
                          " " + dir.file("text.txt") + " " + dir.file("reference.u32");
  int status = std::system(reference.c_str());
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) GTEST_SKIP() << "python3-regex not installed";
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << reference;
  std::string alloy = std::string(ALLOY_BINARY) + " tokenize " + dir.file("text.txt") + " -o " + dir.file("alloy.bin") +
                      " --tokenizer " + tokenizer + " > " + dir.file("alloy.log") + " 2>&1";
  status = std::system(alloy.c_str());
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << alloy << "\n"
                                                             << test::bytes_read(dir.file("alloy.log"));

  std::vector<std::uint32_t> expected = u32_read(dir.file("reference.u32"));
  TokenFile file = token_file_open(dir.file("alloy.bin"), 0);
  ASSERT_EQ(file.token_count(), static_cast<std::int64_t>(expected.size()));
  std::vector<std::int32_t> got(expected.size());
  file.tokens_read(0, got);
  for (std::size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(static_cast<std::uint32_t>(got[i]), expected[i]) << family << ": first difference at token " << i;
  }
  std::cout << family << ": " << expected.size() << " tokens agree; " << test::bytes_read(dir.file("alloy.log"));
}

TEST(BpeReference, Gpt2) { reference_agrees("gpt2", reference_text()); }
TEST(BpeReference, Llama3) { reference_agrees("llama3", reference_text()); }
TEST(BpeReference, Qwen2) { reference_agrees("qwen2", reference_text()); }
TEST(BpeReference, Gpt2TrickyText) { reference_agrees("gpt2", tricky_text()); }
TEST(BpeReference, Llama3TrickyText) { reference_agrees("llama3", tricky_text()); }
TEST(BpeReference, Qwen2TrickyText) { reference_agrees("qwen2", tricky_text()); }

}  // namespace
}  // namespace alloy
