// Byte-level BPE: merge order, ignore_merges, added tokens, the byte alphabet, token file
// widths, the validation split, and a precise error for each kind of bad tokenizer.json.
#include "runtime/io/bpe_tokenizer.hpp"

#include <nlohmann/json.hpp>

#include "io_test_util.hpp"
#include "runtime/io/token_file.hpp"
#include "runtime/io/tokenize.hpp"

namespace alloy {
namespace {

using nlohmann::json;
using test::error_of;
using Ids = std::vector<std::uint32_t>;

// A GPT-2 style tokenizer.json: byte b has id b, `tokens` (in the byte alphabet) follow from
// 256, with the given merges and options.
json bpe_json(const std::vector<std::string>& tokens, const std::vector<std::string>& merges,
              bool ignore_merges = false) {
  json vocab = json::object();
  for (int byte = 0; byte < 256; ++byte) vocab[bpe_byte_symbol(static_cast<unsigned char>(byte))] = byte;
  for (std::size_t i = 0; i < tokens.size(); ++i) vocab[tokens[i]] = 256 + i;
  json model = {{"type", "BPE"},  {"dropout", nullptr}, {"byte_fallback", false}, {"ignore_merges", ignore_merges},
                {"vocab", vocab}, {"merges", merges}};
  return {{"version", "1.0"},
          {"added_tokens", json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"model", model}};
}

json added_token(std::uint32_t id, const std::string& content) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", true}};
}

BpeTokenizer tokenizer_from(const test::ScratchDir& dir, const json& config) {
  test::bytes_write(dir.file("tokenizer.json"), config.dump());
  return bpe_tokenizer_load(dir.file("tokenizer.json"));
}

Ids tokens_of(const TokenFile& file) {
  Ids ids;
  for (std::int64_t i = 0; i < file.token_count(); ++i) ids.push_back(file.token(i));
  return ids;
}

TEST(Bpe, ByteAlphabetIsGpt2s) {
  EXPECT_EQ(bpe_byte_symbol('A'), "A");
  EXPECT_EQ(bpe_byte_symbol(' '), "\xC4\xA0");   // U+0120 Ġ
  EXPECT_EQ(bpe_byte_symbol('\n'), "\xC4\x8A");  // U+010A Ċ
  EXPECT_EQ(bpe_byte_symbol(127), "\xC4\xA1");   // U+0121: after the 33 bytes 0..32
  EXPECT_EQ(bpe_byte_symbol(173), "\xC5\x83");   // U+0143: the soft hyphen is the last of 68
  EXPECT_EQ(bpe_byte_symbol(255), "\xC3\xBF");   // ÿ stands for itself
}

TEST(Bpe, MergesApplyLowestRankFirst) {
  test::ScratchDir dir;
  const std::vector<std::string> tokens = {"ab", "bc", "abc"};  // ids 256, 257, 258
  EXPECT_EQ(bpe_encode(tokenizer_from(dir, bpe_json(tokens, {"b c", "a b", "a bc"})), "abc"), (Ids{258}));
  EXPECT_EQ(bpe_encode(tokenizer_from(dir, bpe_json(tokens, {"a b", "b c", "ab c"})), "abc"), (Ids{258}));
  EXPECT_EQ(bpe_encode(tokenizer_from(dir, bpe_json(tokens, {"b c", "a b"})), "abc"), (Ids{'a', 257}));
  EXPECT_EQ(bpe_encode(tokenizer_from(dir, bpe_json(tokens, {"a b", "b c"})), "abc"), (Ids{256, 'c'}));
}

// A pair listed twice takes its later rank, as Hugging Face's merge map does: "a b" ranks after
// "b c" here, so "abc" becomes a + bc.
TEST(Bpe, ARepeatedMergeTakesItsLastRank) {
  test::ScratchDir dir;
  const std::vector<std::string> tokens = {"ab", "bc"};
  EXPECT_EQ(bpe_encode(tokenizer_from(dir, bpe_json(tokens, {"a b", "b c", "a b"})), "abc"), (Ids{'a', 257}));
}

TEST(Bpe, EqualRanksMergeLeftmostFirst) {
  test::ScratchDir dir;
  BpeTokenizer tokenizer = tokenizer_from(dir, bpe_json({"aa"}, {"a a"}));
  EXPECT_EQ(bpe_encode(tokenizer, "aaa"), (Ids{256, 'a'}));
  EXPECT_EQ(bpe_encode(tokenizer, "aaaaa"), (Ids{256, 256, 'a'}));
  std::string long_run(1000, 'a');  // longer than the cache takes
  EXPECT_EQ(bpe_encode(tokenizer, long_run), Ids(500, 256));
}

TEST(Bpe, MergesAcceptThePairForm) {
  test::ScratchDir dir;
  json config = bpe_json({"ab"}, {});
  config["model"]["merges"] = json::array({json::array({"a", "b"})});
  EXPECT_EQ(bpe_encode(tokenizer_from(dir, config), "ab"), (Ids{256}));
}

TEST(Bpe, IgnoreMergesEmitsAPretokenInTheVocabularyWhole) {
  test::ScratchDir dir;
  const std::vector<std::string> tokens = {"bc", "abc"};
  EXPECT_EQ(bpe_encode(tokenizer_from(dir, bpe_json(tokens, {"b c"}, false)), "abc"), (Ids{'a', 256}));
  BpeTokenizer ignoring = tokenizer_from(dir, bpe_json(tokens, {"b c"}, true));
  EXPECT_EQ(bpe_encode(ignoring, "abc"), (Ids{257}));
  EXPECT_EQ(bpe_encode(ignoring, "x abc"), (Ids{'x', ' ', 'a', 256})) << "\" abc\" is not in the vocabulary";
}

TEST(Bpe, AddedTokensMatchLiterallyLongestFirst) {
  test::ScratchDir dir;
  json config = bpe_json({"\xC4\xA0\xC4\xA0"}, {"\xC4\xA0 \xC4\xA0"});  // "  " is token 256
  config["added_tokens"] = json::array({added_token(300, "<|end"), added_token(301, "<|endoftext|>")});
  BpeTokenizer tokenizer = tokenizer_from(dir, config);
  EXPECT_EQ(bpe_encode(tokenizer, "x<|endoftext|>y<|end|>"), (Ids{'x', 301, 'y', 300, '|', '>'}));
  // An added token ends the text the pattern sees: "  " before it is one run, not " " and " <".
  EXPECT_EQ(bpe_encode(tokenizer, "a  <|end"), (Ids{'a', 256, 300}));
  EXPECT_EQ(bpe_encode(tokenizer, "ab<|endoftext|>c"), (Ids{'a', 'b', 301, 'c'}));
  EXPECT_EQ(tokenizer.vocab_size, 302);
}

TEST(Bpe, AnyBytesEncode) {
  test::ScratchDir dir;
  BpeTokenizer tokenizer = tokenizer_from(dir, bpe_json({}, {}));
  EXPECT_EQ(bpe_encode(tokenizer, std::string("\xFF\xFE\x00 a", 5)), (Ids{255, 254, 0, ' ', 'a'}));
}

TEST(Bpe, TokenFileWidthFollowsTheVocabulary) {
  EXPECT_EQ(token_file_version_for(256), TokenFileVersion::TokenFileVersion_uint16);
  EXPECT_EQ(token_file_version_for(65536), TokenFileVersion::TokenFileVersion_uint16);
  EXPECT_EQ(token_file_version_for(65537), TokenFileVersion::TokenFileVersion_uint32);
  EXPECT_EQ(token_file_version_for(128256), TokenFileVersion::TokenFileVersion_uint32);

  test::ScratchDir dir;
  json config = bpe_json({}, {});
  config["added_tokens"] = json::array({added_token(70000, "<|big|>")});
  test::bytes_write(dir.file("tokenizer.json"), config.dump());
  test::bytes_write(dir.file("in.txt"), "hi<|big|>");
  TokenizeResult result = tokenize_bpe(dir.file("in.txt"), dir.file("out.bin"), dir.file("tokenizer.json"), 0.0);
  EXPECT_EQ(result.version, TokenFileVersion::TokenFileVersion_uint32);
  EXPECT_EQ(result.vocab_size, 70001);
  TokenFile file = token_file_open(result.train_path, result.vocab_size);
  EXPECT_EQ(file.version(), TokenFileVersion::TokenFileVersion_uint32);
  EXPECT_EQ(tokens_of(file), (Ids{'h', 'i', 70000}));
  // Training a model with a smaller vocabulary on it fails naming the token.
  Error small = error_of([&] { token_file_open(result.train_path, 1000); });
  EXPECT_EQ(small.where().field, "tokens[2]");
  EXPECT_ERROR_SAYS(small, "token id 70000 at position 2 is not below the model's vocabulary size 1000");

  test::bytes_write(dir.file("narrow.json"), bpe_json({}, {}).dump());
  TokenizeResult narrow = tokenize_bpe(dir.file("in.txt"), dir.file("narrow.bin"), dir.file("narrow.json"), 0.0);
  EXPECT_EQ(narrow.version, TokenFileVersion::TokenFileVersion_uint16);
  EXPECT_EQ(token_file_open(narrow.train_path, 256).version(), TokenFileVersion::TokenFileVersion_uint16);
}

TEST(Bpe, ValidationSplitFallsOnAPieceBoundary) {
  test::ScratchDir dir;
  BpeTokenizer tokenizer = tokenizer_from(dir, bpe_json({"ab"}, {"a b"}));
  std::string text = "ab ab abab ab ab abababab ab";
  test::bytes_write(dir.file("in.txt"), text);
  TokenizeResult result = tokenize_bpe(dir.file("in.txt"), dir.file("d.bin"), dir.file("tokenizer.json"), 0.3);
  Ids train = tokens_of(token_file_open(result.train_path, 257));
  Ids val = tokens_of(token_file_open(result.val_path, 257));
  EXPECT_EQ(train.size(), 15u) << "the split byte 20 is inside \" abababab\" (bytes 16..25), which goes to train";
  EXPECT_EQ(val, (Ids{' ', 256}));
  train.insert(train.end(), val.begin(), val.end());
  EXPECT_EQ(train, bpe_encode(tokenizer, text));
}

// Writes `config` and returns the error loading it gives.
Error load_error(const test::ScratchDir& dir, const json& config) {
  test::bytes_write(dir.file("bad.json"), config.dump());
  return error_of([&] { bpe_tokenizer_load(dir.file("bad.json")); });
}

// A run without a break longer than the encoder merges at once is refused with its place, not
// merged in tens of bytes of memory per byte.
TEST(Bpe, AnOverlongPieceIsRefused) {
  test::ScratchDir dir;
  BpeTokenizer tokenizer = tokenizer_from(dir, bpe_json({}, {}));
  const std::string text = "ab " + std::string((std::size_t{16} << 20) + 1, 'x');
  Error e = error_of([&] { bpe_encode(tokenizer, text); });
  EXPECT_ERROR_SAYS(e, "without a break at byte 2 of the text");
}

TEST(Bpe, MissingOrMalformedFilesAreRefused) {
  test::ScratchDir dir;
  Error missing = error_of([&] { bpe_tokenizer_load(dir.file("none.json")); });
  EXPECT_EQ(missing.where().file, dir.file("none.json"));
  EXPECT_ERROR_SAYS(missing, "tokenizer file not found");

  test::bytes_write(dir.file("text.json"), "{\"model\": ");
  Error not_json = error_of([&] { bpe_tokenizer_load(dir.file("text.json")); });
  EXPECT_EQ(not_json.where().file, dir.file("text.json"));
  EXPECT_ERROR_SAYS(not_json, "not valid JSON: syntax error at byte");

  test::bytes_write(dir.file("list.json"), "[1, 2]");
  EXPECT_ERROR_SAYS(error_of([&] { bpe_tokenizer_load(dir.file("list.json")); }), "not a JSON object");

  json huge_id = bpe_json({}, {});
  huge_id["added_tokens"].push_back(added_token(0, "<|x|>"));
  huge_id["added_tokens"][0]["id"] = std::uint64_t{1} << 32;
  Error id_error = load_error(dir, huge_id);
  EXPECT_EQ(id_error.where().field, "added_tokens[0].id");
  EXPECT_ERROR_SAYS(id_error, "is not a whole number in [0, 2^31)");

  json wrong_type = bpe_json({}, {});
  wrong_type["model"]["ignore_merges"] = "yes";
  EXPECT_ERROR_SAYS(load_error(dir, wrong_type), "unexpected JSON type");
}

TEST(Bpe, UnsupportedModelsAreRefusedByField) {
  test::ScratchDir dir;
  json word_piece = bpe_json({}, {});
  word_piece["model"]["type"] = "WordPiece";
  Error e = load_error(dir, word_piece);
  EXPECT_EQ(e.where().file, dir.file("bad.json"));
  EXPECT_EQ(e.where().field, "model.type");
  EXPECT_ERROR_SAYS(e, "model type \"WordPiece\" is not supported");
  EXPECT_TRUE(test::contains(e.hint(), "GPT-2, Llama 3 and Qwen2")) << e.format();

  json fallback = bpe_json({}, {});
  fallback["model"]["byte_fallback"] = true;
  EXPECT_EQ(load_error(dir, fallback).where().field, "model.byte_fallback");

  json lowercase = bpe_json({}, {});
  lowercase["normalizer"] = {{"type", "Lowercase"}};
  Error normalizer = load_error(dir, lowercase);
  EXPECT_EQ(normalizer.where().field, "normalizer");
  EXPECT_ERROR_SAYS(normalizer, "normalizer \"Lowercase\" is not supported: it changes the text");

  json prefix = bpe_json({}, {});
  prefix["pre_tokenizer"]["add_prefix_space"] = true;
  EXPECT_EQ(load_error(dir, prefix).where().field, "pre_tokenizer.add_prefix_space");

  json whitespace = bpe_json({}, {});
  whitespace["pre_tokenizer"] = {{"type", "Whitespace"}};
  Error pre = load_error(dir, whitespace);
  EXPECT_EQ(pre.where().field, "pre_tokenizer");
  EXPECT_ERROR_SAYS(pre, "pre-tokenizer \"Whitespace\" is not supported");

  json stripped = bpe_json({}, {});
  json token = added_token(300, "<x>");
  token["lstrip"] = true;
  stripped["added_tokens"] = json::array({token});
  EXPECT_EQ(load_error(dir, stripped).where().field, "added_tokens[0].lstrip");
}

TEST(Bpe, UnknownRegexIsRefusedListingTheSupportedOnes) {
  test::ScratchDir dir;
  json config = bpe_json({}, {});
  config["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array(
           {{{"type", "Split"}, {"pattern", {{"Regex", "\\w+|\\s+"}}}, {"behavior", "Isolated"}, {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  Error e = load_error(dir, config);
  EXPECT_EQ(e.where().field, "pre_tokenizer.pretokenizers[0].pattern.Regex");
  EXPECT_ERROR_SAYS(e, "unknown pre-tokenizer regex \\w+|\\s+");
  EXPECT_TRUE(test::contains(e.hint(), std::string(pretoken_pattern_regex(PretokenPattern::PretokenPattern_llama3))))
      << e.format();

  config["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] =
      std::string(pretoken_pattern_regex(PretokenPattern::PretokenPattern_qwen2));
  test::bytes_write(dir.file("qwen.json"), config.dump());
  EXPECT_EQ(bpe_tokenizer_load(dir.file("qwen.json")).pattern, PretokenPattern::PretokenPattern_qwen2);
}

TEST(Bpe, VocabularyAndMergeMistakesAreRefused) {
  test::ScratchDir dir;
  Error unknown = load_error(dir, bpe_json({"ab"}, {"a b", "a q"}));
  EXPECT_EQ(unknown.where().field, "model.merges[1]");
  EXPECT_ERROR_SAYS(unknown, "merge refers to unknown token \"aq\" (not in model.vocab)");

  Error shape = load_error(dir, bpe_json({"ab"}, {"ab"}));
  EXPECT_EQ(shape.where().field, "model.merges[0]");
  EXPECT_ERROR_SAYS(shape, "neither \"left right\" nor [\"left\", \"right\"]");

  json missing_byte = bpe_json({}, {});
  missing_byte["model"]["vocab"].erase(bpe_byte_symbol('\n'));
  Error byte = load_error(dir, missing_byte);
  EXPECT_EQ(byte.where().field, "model.vocab");
  EXPECT_ERROR_SAYS(byte, "no token for byte 10");

  json not_byte_level = bpe_json({"\xE2\x96\x81the"}, {});  // SentencePiece's ▁ is not in the alphabet
  Error alphabet = load_error(dir, not_byte_level);
  EXPECT_EQ(alphabet.where().field, "model.vocab[\"\xE2\x96\x81the\"]");
  EXPECT_ERROR_SAYS(alphabet, "is not written in the byte-level alphabet");
}

}  // namespace
}  // namespace alloy
