// Byte-level tokenizer: byte values become tokens, splits keep every byte exactly once.
#include "runtime/io/tokenize.hpp"

#include "io_test_util.hpp"
#include "runtime/io/token_file.hpp"

namespace alloy {
namespace {

using test::error_of;

std::string every_byte_value(std::size_t count) {
  std::string bytes(count, '\0');
  for (std::size_t i = 0; i < count; ++i) bytes[i] = static_cast<char>((i * 131 + 7) % 256);
  return bytes;
}

std::string tokens_as_bytes(const TokenFile& file) {
  std::string bytes;
  for (std::int64_t i = 0; i < file.token_count(); ++i) bytes += static_cast<char>(file.token(i));
  return bytes;
}

TEST(Tokenize, EveryByteBecomesItsValue) {
  test::ScratchDir dir;
  std::string input = every_byte_value(1000);
  test::bytes_write(dir.file("in.dat"), input);
  TokenizeResult result = tokenize_bytes(dir.file("in.dat"), dir.file("out.bin"), 0.0);
  EXPECT_EQ(result.train_path, dir.file("out.bin"));
  EXPECT_TRUE(result.val_path.empty());
  EXPECT_EQ(result.train_tokens, 1000);
  TokenFile file = token_file_open(result.train_path, kByteVocabSize);
  EXPECT_EQ(file.version(), TokenFileVersion::TokenFileVersion_uint16);
  EXPECT_EQ(tokens_as_bytes(file), input);
}

TEST(Tokenize, SplitPutsTheLastFractionInValidation) {
  test::ScratchDir dir;
  std::string input = every_byte_value(1000);
  test::bytes_write(dir.file("in.dat"), input);
  TokenizeResult result = tokenize_bytes(dir.file("in.dat"), dir.file("data.bin"), 0.25);
  EXPECT_EQ(result.train_path, dir.file("data_train.bin"));
  EXPECT_EQ(result.val_path, dir.file("data_val.bin"));
  EXPECT_EQ(result.train_tokens, 750);
  EXPECT_EQ(result.val_tokens, 250);
  EXPECT_EQ(tokens_as_bytes(token_file_open(result.train_path, 256)), input.substr(0, 750));
  EXPECT_EQ(tokens_as_bytes(token_file_open(result.val_path, 256)), input.substr(750));
}

TEST(Tokenize, SplitPathNames) {
  EXPECT_EQ(tokenize_split_path("d/x.bin", "train"), "d/x_train.bin");
  EXPECT_EQ(tokenize_split_path("x", "val"), "x_val.bin");
  EXPECT_EQ(tokenize_split_path("d/x.txt", "val"), "d/x.txt_val.bin");
}

TEST(Tokenize, ShippedTextTokenizesToEnglishBytes) {
  std::string text = std::string(ALLOY_SOURCE_DIR) + "/examples/data/fsf_licenses.txt";
  test::ScratchDir dir;
  TokenizeResult result = tokenize_bytes(text, dir.file("fsf.bin"), 0.1);
  auto size = static_cast<std::int64_t>(std::filesystem::file_size(text));
  EXPECT_GT(size, 100000);
  EXPECT_LT(size, 300000);
  EXPECT_EQ(result.train_tokens + result.val_tokens, size);
  EXPECT_NEAR(static_cast<double>(result.val_tokens) / static_cast<double>(size), 0.1, 1e-4);
  TokenFile train = token_file_open(result.train_path, kByteVocabSize);
  std::int64_t printable = 0;
  for (std::int64_t i = 0; i < train.token_count(); ++i) {
    std::uint32_t t = train.token(i);
    printable += (t >= 32 && t < 127) || t == '\n';
  }
  EXPECT_GT(static_cast<double>(printable) / static_cast<double>(train.token_count()), 0.99);
}

TEST(Tokenize, Errors) {
  test::ScratchDir dir;
  Error missing = error_of([&] { tokenize_bytes(dir.file("none.txt"), dir.file("o.bin"), 0.0); });
  EXPECT_EQ(missing.where().file, dir.file("none.txt"));
  EXPECT_ERROR_SAYS(missing, "not found");

  test::bytes_write(dir.file("empty.txt"), "");
  Error empty = error_of([&] { tokenize_bytes(dir.file("empty.txt"), dir.file("o.bin"), 0.0); });
  EXPECT_EQ(empty.where().file, dir.file("empty.txt"));
  EXPECT_ERROR_SAYS(empty, "empty");

  test::bytes_write(dir.file("ten.txt"), "0123456789");
  for (double bad : {-0.1, 1.0, 2.0}) {
    Error e = error_of([&] { tokenize_bytes(dir.file("ten.txt"), dir.file("o.bin"), bad); });
    EXPECT_EQ(e.where().field, "--val-fraction");
    EXPECT_ERROR_SAYS(e, "outside [0, 1)");
  }
  Error tiny = error_of([&] { tokenize_bytes(dir.file("ten.txt"), dir.file("o.bin"), 0.01); });
  EXPECT_EQ(tiny.where().field, "--val-fraction");
  EXPECT_ERROR_SAYS(tiny, "empty");
  EXPECT_FALSE(std::filesystem::exists(dir.file("o_train.bin")));
}

}  // namespace
}  // namespace alloy
