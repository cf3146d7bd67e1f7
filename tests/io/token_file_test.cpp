// Token files: byte layout, round trips, and one error test per kind of bad file.
#include "runtime/io/token_file.hpp"

#include <cstring>
#include <random>

#include "io_test_util.hpp"

namespace alloy {
namespace {

using test::error_of;

std::vector<std::uint32_t> random_tokens(std::size_t count, std::uint32_t bound, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint32_t> tokens(count);
  for (auto& t : tokens) t = rng() % bound;
  return tokens;
}

// Header of 256 int32 followed by `payload` bytes.
std::string raw_token_file(std::int32_t magic, std::int32_t version, std::int32_t count, const std::string& payload) {
  std::string bytes(kTokenFileHeaderBytes, '\0');
  std::int32_t header[3] = {magic, version, count};
  std::memcpy(bytes.data(), header, sizeof(header));
  return bytes + payload;
}

TEST(TokenFile, WritesLlmcLayoutByteForByte) {
  test::ScratchDir dir;
  std::vector<std::uint32_t> tokens = {0, 1, 255, 256, 65535, 7};
  token_file_write(dir.file("a.bin"), tokens, TokenFileVersion::TokenFileVersion_uint16);
  std::string bytes = test::bytes_read(dir.file("a.bin"));
  ASSERT_EQ(bytes.size(), 1024u + 2 * tokens.size());
  std::int32_t header[256];
  std::memcpy(header, bytes.data(), sizeof(header));
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 6);
  for (int i = 3; i < 256; ++i) EXPECT_EQ(header[i], 0) << "header[" << i << "]";
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    auto lo = static_cast<unsigned char>(bytes[1024 + 2 * i]);
    auto hi = static_cast<unsigned char>(bytes[1024 + 2 * i + 1]);
    EXPECT_EQ(lo + 256u * hi, tokens[i]) << "token " << i;
  }
}

TEST(TokenFile, RoundTripsBothVersions) {
  test::ScratchDir dir;
  struct Case {
    TokenFileVersion version;
    std::uint32_t bound;
  };
  for (Case c : {Case{TokenFileVersion::TokenFileVersion_uint16, 65536},
                 Case{TokenFileVersion::TokenFileVersion_uint32, 200000}}) {
    auto tokens = random_tokens(5000, c.bound, 7);
    std::string path = dir.file("round.bin");
    token_file_write(path, tokens, c.version);
    TokenFile file = token_file_open(path, 0);
    EXPECT_EQ(file.version(), c.version);
    ASSERT_EQ(file.token_count(), 5000);
    for (std::size_t i = 0; i < tokens.size(); ++i) ASSERT_EQ(file.token(i), tokens[i]);
    std::vector<std::int32_t> window(100);
    file.tokens_read(1234, window);
    for (std::size_t i = 0; i < window.size(); ++i) {
      EXPECT_EQ(static_cast<std::uint32_t>(window[i]), tokens[1234 + i]);
    }
  }
}

TEST(TokenFile, WriterStreamsInPiecesAndLeavesNoFileWithoutFinish) {
  test::ScratchDir dir;
  auto tokens = random_tokens(3000, 256, 3);
  {
    TokenFileWriter writer(dir.file("s.bin"), TokenFileVersion::TokenFileVersion_uint16);
    writer.append(std::span(tokens).first(1000));
    std::vector<unsigned char> bytes(tokens.begin() + 1000, tokens.end());
    writer.append_bytes(bytes);
    EXPECT_EQ(writer.token_count(), 3000);
    writer.finish();
  }
  TokenFile file = token_file_open(dir.file("s.bin"), 256);
  ASSERT_EQ(file.token_count(), 3000);
  for (std::size_t i = 0; i < tokens.size(); ++i) ASSERT_EQ(file.token(i), tokens[i]);
  {
    TokenFileWriter abandoned(dir.file("gone.bin"), TokenFileVersion::TokenFileVersion_uint16);
    abandoned.append(tokens);
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("gone.bin")));
  for (const auto& entry :
       std::filesystem::directory_iterator(std::filesystem::path(dir.file("s.bin")).parent_path())) {
    EXPECT_EQ(entry.path().filename(), "s.bin") << "left behind: " << entry.path();
  }
}

TEST(TokenFile, Uint16WriterRejectsWideToken) {
  test::ScratchDir dir;
  std::vector<std::uint32_t> tokens = {1, 2, 70000};
  Error e = error_of([&] { token_file_write(dir.file("w.bin"), tokens, TokenFileVersion::TokenFileVersion_uint16); });
  EXPECT_ERROR_SAYS(e, "70000");
  EXPECT_EQ(e.where().field, "tokens[2]");
  EXPECT_FALSE(std::filesystem::exists(dir.file("w.bin")));
}

TEST(TokenFile, MissingFile) {
  test::ScratchDir dir;
  Error e = error_of([&] { token_file_open(dir.file("nope.bin"), 0); });
  EXPECT_EQ(e.where().file, dir.file("nope.bin"));
  EXPECT_ERROR_SAYS(e, "not found");
}

TEST(TokenFile, HeaderTooShort) {
  test::ScratchDir dir;
  test::bytes_write(dir.file("short.bin"), std::string(100, '\0'));
  Error e = error_of([&] { token_file_open(dir.file("short.bin"), 0); });
  EXPECT_EQ(e.where().file, dir.file("short.bin"));
  EXPECT_EQ(e.where().field, "header");
  EXPECT_ERROR_SAYS(e, "100 bytes");
  EXPECT_ERROR_SAYS(e, "1024");
}

TEST(TokenFile, BadMagic) {
  test::ScratchDir dir;
  test::bytes_write(dir.file("m.bin"), raw_token_file(12345, 1, 0, ""));
  Error e = error_of([&] { token_file_open(dir.file("m.bin"), 0); });
  EXPECT_EQ(e.where().file, dir.file("m.bin"));
  EXPECT_TRUE(test::contains(e.where().field, "magic"));
  EXPECT_ERROR_SAYS(e, "12345");
  EXPECT_ERROR_SAYS(e, "20240520");
}

TEST(TokenFile, UnknownVersion) {
  test::ScratchDir dir;
  test::bytes_write(dir.file("v.bin"), raw_token_file(kTokenFileMagic, 3, 0, ""));
  Error e = error_of([&] { token_file_open(dir.file("v.bin"), 0); });
  EXPECT_TRUE(test::contains(e.where().field, "version"));
  EXPECT_ERROR_SAYS(e, "unknown version 3");
}

TEST(TokenFile, TruncatedReportsExpectedAndActualBytes) {
  test::ScratchDir dir;
  // The header promises 100 uint16 tokens (1224 bytes in all); only 75 are there (1174 bytes).
  test::bytes_write(dir.file("t.bin"), raw_token_file(kTokenFileMagic, 1, 100, std::string(150, 'x')));
  Error e = error_of([&] { token_file_open(dir.file("t.bin"), 0); });
  EXPECT_EQ(e.where().file, dir.file("t.bin"));
  EXPECT_TRUE(test::contains(e.where().field, "token count"));
  EXPECT_ERROR_SAYS(e, "truncated");
  EXPECT_ERROR_SAYS(e, "1224 bytes");
  EXPECT_ERROR_SAYS(e, "1174 bytes");
}

TEST(TokenFile, TokenAtOrAboveVocabularyNamesFirstPosition) {
  test::ScratchDir dir;
  auto tokens = random_tokens(100, 256, 5);
  tokens[37] = 300;
  tokens[60] = 999;
  token_file_write(dir.file("v.bin"), tokens, TokenFileVersion::TokenFileVersion_uint16);
  Error e = error_of([&] { token_file_open(dir.file("v.bin"), 256); });
  EXPECT_EQ(e.where().file, dir.file("v.bin"));
  EXPECT_EQ(e.where().field, "tokens[37]");
  EXPECT_ERROR_SAYS(e, "token id 300 at position 37");
  EXPECT_ERROR_SAYS(e, "another vocabulary");
  tokens[60] = 0;
  token_file_write(dir.file("v.bin"), tokens, TokenFileVersion::TokenFileVersion_uint16);
  EXPECT_EQ(token_file_open(dir.file("v.bin"), 301).token(37), 300u);
  // Exactly the vocabulary size is already out of range.
  EXPECT_EQ(error_of([&] { token_file_open(dir.file("v.bin"), 300); }).where().field, "tokens[37]");
}

TEST(TokenFile, PartialTokenAtTheEndIsAnError) {
  test::ScratchDir dir;
  // 10 uint32 tokens promised, 41 bytes after the header: not a whole number of tokens.
  test::bytes_write(dir.file("odd.bin"), raw_token_file(kTokenFileMagic, 2, 10, std::string(41, '\0')));
  Error e = error_of([&] { token_file_open(dir.file("odd.bin"), 0); });
  EXPECT_EQ(e.where().file, dir.file("odd.bin"));
  EXPECT_ERROR_SAYS(e, "41 bytes follow the header");
  EXPECT_ERROR_SAYS(e, "4-byte tokens");
}

// A file cut short while a run reads it: an error naming the file, where a memory map raised
// SIGBUS and killed the process.
TEST(TokenFile, FileShrinkingUnderneathIsAnError) {
  test::ScratchDir dir;
  const auto tokens = random_tokens(20000, 256, 3);
  token_file_write(dir.file("s.bin"), tokens, TokenFileVersion::TokenFileVersion_uint16);
  TokenFile file = token_file_open(dir.file("s.bin"), 256);
  std::vector<std::int32_t> window(1000);
  file.tokens_read(15000, window);
  EXPECT_EQ(window[0], static_cast<std::int32_t>(tokens[15000]));
  std::filesystem::resize_file(dir.file("s.bin"), kTokenFileHeaderBytes + 2 * 4096);
  Error e = error_of([&] { file.tokens_read(15000, window); });
  EXPECT_EQ(e.where().file, dir.file("s.bin"));
  EXPECT_ERROR_SAYS(e, "shrank");
  file.tokens_read(10, {window.data(), 100});  // what is still there still reads
  EXPECT_EQ(window[5], static_cast<std::int32_t>(tokens[15]));
}

TEST(TokenFile, WindowOutsideFileIsAnError) {
  test::ScratchDir dir;
  auto tokens = random_tokens(10, 256, 1);
  token_file_write(dir.file("w.bin"), tokens, TokenFileVersion::TokenFileVersion_uint16);
  TokenFile file = token_file_open(dir.file("w.bin"), 0);
  std::vector<std::int32_t> window(5);
  Error e = error_of([&] { file.tokens_read(6, window); });
  EXPECT_EQ(e.where().file, dir.file("w.bin"));
  EXPECT_ERROR_SAYS(e, "[6, 11)");
}

}  // namespace
}  // namespace alloy
