// Reading a Hugging Face tokenizer.json into a BpeTokenizer (see bpe_tokenizer.hpp): what is
// not a byte-level BPE of the supported families is refused, naming the JSON field.
#include <algorithm>
#include <cstdint>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/io/bpe_tokenizer.hpp"
#include "runtime/io/file_io.hpp"
#include "runtime/io/unicode_text.hpp"

namespace alloy {

namespace {

using nlohmann::json;

constexpr const char* kSupported =
    "alloy tokenize reads byte-level BPE tokenizers (model.type \"BPE\", ByteLevel pre-tokenizer) of the GPT-2, "
    "Llama 3 and Qwen2 families";

// GPT-2's byte-to-unicode alphabet: printable Latin-1 bytes stand for themselves, the other 68
// (controls, space, DEL, NBSP, soft hyphen) for 256, 257, ... in byte order.
std::array<char32_t, 256> byte_symbol_table() {
  std::array<char32_t, 256> symbols{};
  char32_t next_unprintable = 256;
  for (std::size_t byte = 0; byte < 256; ++byte) {
    bool printable = (byte >= 33 && byte <= 126) || (byte >= 161 && byte <= 172) || byte >= 174;
    symbols[byte] = printable ? static_cast<char32_t>(byte) : next_unprintable++;
  }
  return symbols;
}

const std::array<char32_t, 256> kByteSymbols = byte_symbol_table();

std::string utf8_encode(char32_t value) {
  std::string bytes;
  if (value < 0x80) {
    bytes += static_cast<char>(value);
  } else if (value < 0x800) {
    bytes += static_cast<char>(0xC0 | (value >> 6));
    bytes += static_cast<char>(0x80 | (value & 0x3F));
  } else {
    bytes += static_cast<char>(0xE0 | (value >> 12));
    bytes += static_cast<char>(0x80 | ((value >> 6) & 0x3F));
    bytes += static_cast<char>(0x80 | (value & 0x3F));
  }
  return bytes;
}

[[noreturn]] void refuse(const std::string& path, const std::string& field, const std::string& what,
                         const std::string& fix = kSupported) {
  throw Error(what, io_where(path, field), fix);
}

// The raw bytes a vocabulary token stands for, decoding the byte-to-unicode alphabet.
std::string token_bytes(const std::string& path, const std::string& token) {
  static const std::unordered_map<char32_t, unsigned char> byte_of_symbol = [] {
    std::unordered_map<char32_t, unsigned char> table;
    for (std::size_t byte = 0; byte < 256; ++byte) table[kByteSymbols[byte]] = static_cast<unsigned char>(byte);
    return table;
  }();
  std::string bytes;
  for (std::size_t pos = 0; pos < token.size();) {
    CodePoint point = code_point_at(token, pos);
    auto byte = byte_of_symbol.find(point.value);
    if (byte == byte_of_symbol.end()) {
      refuse(path, "model.vocab[\"" + token + "\"]",
             "token \"" + token + "\" is not written in the byte-level alphabet (GPT-2's bytes_to_unicode)",
             std::string(kSupported) + "; this vocabulary is not byte-level");
    }
    bytes += static_cast<char>(byte->second);
    pos += point.length_bytes;
  }
  return bytes;
}

json json_read(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw Error("tokenizer file not found", io_where(path), "pass the tokenizer.json of a Hugging Face model");
  }
  MappedFile file = mapped_file_open(path, "tokenizer file");
  auto text = reinterpret_cast<const char*>(file.bytes().data());
  json root;
  try {
    root = json::parse(text, text + file.size_bytes());
  } catch (const json::parse_error& e) {
    throw Error(fmt::format("not valid JSON: syntax error at byte {}", e.byte), io_where(path),
                "pass the tokenizer.json of a Hugging Face model, whole (a truncated download fails here)");
  }
  if (!root.is_object()) {
    throw Error("not a JSON object: a tokenizer.json holds one", io_where(path),
                "pass the tokenizer.json of a Hugging Face model (not tokenizer_config.json or vocab.json)");
  }
  return root;
}

// Refuses model options that change what BPE produces: byte fallback, dropout, subword
// prefixes or suffixes.
void model_check_options(const std::string& path, const json& model) {
  const std::string type = model.value("type", std::string());
  if (type != "BPE") refuse(path, "model.type", "model type \"" + type + "\" is not supported");
  if (model.value("byte_fallback", false)) {
    refuse(path, "model.byte_fallback", "byte_fallback true (SentencePiece-style BPE) is not supported");
  }
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"].get<double>() != 0.0) {
    refuse(path, "model.dropout", "BPE dropout is not supported: it makes tokenization random",
           "set model.dropout to null");
  }
  for (const char* field : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(field) && model[field].is_string() && !model[field].get<std::string>().empty()) {
      refuse(path, std::string("model.") + field, std::string(field) + " is not supported by byte-level BPE");
    }
  }
}

bool normalizer_is_nfc(const std::string& path, const json& root) {
  if (!root.contains("normalizer") || root["normalizer"].is_null()) return false;
  const json& normalizer = root["normalizer"];
  std::string type = normalizer.value("type", std::string());
  if (type == "NFC") return true;
  if (type == "Sequence" && normalizer.value("normalizers", json::array()).empty()) return false;
  refuse(path, "normalizer", "normalizer \"" + type + "\" is not supported: it changes the text",
         std::string(kSupported) + ", with no normalizer or NFC (Qwen2)");
}

void byte_level_check(const std::string& path, const json& byte_level, const std::string& field) {
  if (byte_level.value("add_prefix_space", false)) {
    refuse(path, field + ".add_prefix_space", "add_prefix_space true is not supported",
           "the GPT-2, Llama 3 and Qwen2 tokenizers set it false");
  }
}

PretokenPattern pattern_of(const std::string& path, const std::string& field, const std::string& regex) {
  auto pattern = pretoken_pattern_from_regex(regex);
  if (!pattern) {
    std::string known;
    for (PretokenPattern p : {PretokenPattern::PretokenPattern_gpt2, PretokenPattern::PretokenPattern_llama3,
                              PretokenPattern::PretokenPattern_qwen2}) {
      known += std::string("\n    ") + std::string(pretoken_pattern_regex(p));
    }
    refuse(path, field, "unknown pre-tokenizer regex " + regex,
           "the supported patterns (" + pretoken_pattern_names() + ") are, exactly:" + known);
  }
  return *pattern;
}

// GPT-2: ByteLevel with its built-in regex. Llama 3 and Qwen2: Sequence of Split (the regex,
// Isolated) and ByteLevel without a regex.
PretokenPattern pre_tokenizer_pattern(const std::string& path, const json& root) {
  const json& pre = root.contains("pre_tokenizer") ? root["pre_tokenizer"] : json();
  std::string type = pre.is_object() ? pre.value("type", std::string()) : std::string("null");
  if (type == "ByteLevel" && pre.value("use_regex", true)) {
    byte_level_check(path, pre, "pre_tokenizer");
    return PretokenPattern::PretokenPattern_gpt2;
  }
  const json steps = pre.is_object() ? pre.value("pretokenizers", json::array()) : json::array();
  if (type != "Sequence" || steps.size() != 2 || steps[0].value("type", "") != "Split" ||
      steps[1].value("type", "") != "ByteLevel") {
    refuse(path, "pre_tokenizer", "pre-tokenizer \"" + type + "\" is not supported",
           std::string(kSupported) +
               ": ByteLevel with use_regex true, or Sequence of Split (Regex, Isolated) and "
               "ByteLevel with use_regex false");
  }
  const json& split = steps[0];
  if (split.value("behavior", "") != "Isolated" || split.value("invert", false)) {
    refuse(path, "pre_tokenizer.pretokenizers[0].behavior",
           "Split behavior \"" + split.value("behavior", std::string()) + "\" is not supported",
           "the supported tokenizers split with behavior \"Isolated\" and invert false");
  }
  if (!split.contains("pattern") || !split["pattern"].contains("Regex")) {
    refuse(path, "pre_tokenizer.pretokenizers[0].pattern", "the Split pattern is not a Regex",
           "the supported tokenizers give {\"Regex\": \"...\"}");
  }
  byte_level_check(path, steps[1], "pre_tokenizer.pretokenizers[1]");
  if (steps[1].value("use_regex", true)) {
    refuse(path, "pre_tokenizer.pretokenizers[1].use_regex", "a second regex after the Split is not supported",
           "set use_regex false, as Llama 3 and Qwen2 do");
  }
  return pattern_of(path, "pre_tokenizer.pretokenizers[0].pattern.Regex", split["pattern"]["Regex"].get<std::string>());
}

void vocab_read(const std::string& path, const json& model, BpeTokenizer& tokenizer) {
  if (!model.contains("vocab") || !model["vocab"].is_object() || model["vocab"].empty()) {
    refuse(path, "model.vocab", "missing or empty vocabulary", "a BPE tokenizer.json maps token strings to ids here");
  }
  for (const auto& [token, id] : model["vocab"].items()) {
    if (!id.is_number_unsigned() || id.get<std::uint64_t>() > INT32_MAX) {
      refuse(path, "model.vocab[\"" + token + "\"]", "id " + id.dump() + " is not a whole number in [0, 2^31)",
             "token ids are non-negative integers");
    }
    auto value = id.get<std::uint32_t>();
    tokenizer.ids_by_bytes[token_bytes(path, token)] = value;
    tokenizer.vocab_size = std::max<std::int64_t>(tokenizer.vocab_size, std::int64_t{value} + 1);
  }
  for (std::size_t byte = 0; byte < 256; ++byte) {
    auto found = tokenizer.ids_by_bytes.find(std::string(1, static_cast<char>(byte)));
    if (found == tokenizer.ids_by_bytes.end()) {
      refuse(path, "model.vocab",
             "no token for byte " + std::to_string(byte) + " (\"" + bpe_byte_symbol(static_cast<unsigned char>(byte)) +
                 "\"): a byte-level vocabulary has all 256",
             "use the tokenizer.json the model was trained with");
    }
    tokenizer.byte_ids[byte] = found->second;
  }
}

// One entry of model.merges, "left right" or ["left", "right"], as its two token strings.
std::pair<std::string, std::string> merge_parts(const std::string& path, const std::string& field, const json& entry) {
  if (entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_string()) {
    return {entry[0].get<std::string>(), entry[1].get<std::string>()};
  }
  if (entry.is_string()) {
    const std::string text = entry.get<std::string>();
    std::size_t space = text.find(' ');
    if (space != std::string::npos && space > 0 && space + 1 < text.size() &&
        text.find(' ', space + 1) == std::string::npos) {
      return {text.substr(0, space), text.substr(space + 1)};
    }
  }
  refuse(path, field, "merge " + entry.dump() + " is neither \"left right\" nor [\"left\", \"right\"]",
         "write each merge as two token strings");
}

void merges_read(const std::string& path, const json& model, BpeTokenizer& tokenizer) {
  static const json kNoMerges = json::array();
  const json& merges = model.contains("merges") ? model["merges"] : kNoMerges;
  if (!merges.is_array())
    refuse(path, "model.merges", "merges is not a list", "a BPE tokenizer.json lists its merges here");
  const json& vocab = model.at("vocab");  // checked by vocab_read: token strings to ids
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string field = "model.merges[" + std::to_string(rank) + "]";
    auto [left, right] = merge_parts(path, field, merges[rank]);
    std::uint32_t ids[3] = {};
    const std::string parts[3] = {left, right, left + right};
    for (int k = 0; k < 3; ++k) {
      auto found = vocab.find(parts[k]);
      if (found == vocab.end()) {
        refuse(path, field, "merge refers to unknown token \"" + parts[k] + "\" (not in model.vocab)",
               "use the merges and the vocabulary of the same tokenizer.json");
      }
      ids[k] = found->get<std::uint32_t>();
    }
    // A repeated pair takes its last rank: Hugging Face collects the merges into a map in list
    // order, so a later entry replaces an earlier one.
    tokenizer.merges.insert_or_assign(bpe_pair_key(ids[0], ids[1]), BpeMerge{static_cast<std::uint32_t>(rank), ids[2]});
  }
}

void added_tokens_read(const std::string& path, const json& root, BpeTokenizer& tokenizer) {
  const json added = root.value("added_tokens", json::array());
  for (std::size_t i = 0; i < added.size(); ++i) {
    const std::string field = "added_tokens[" + std::to_string(i) + "]";
    const json& entry = added[i];
    if (!entry.is_object() || !entry.contains("content") || !entry["content"].is_string() ||
        entry["content"].get<std::string>().empty() || !entry.contains("id") || !entry["id"].is_number_unsigned()) {
      refuse(path, field, "an added token needs a non-empty \"content\" and a non-negative \"id\"",
             "use the tokenizer.json the model was trained with");
    }
    if (entry["id"].get<std::uint64_t>() > INT32_MAX) {
      refuse(path, field + ".id", "id " + entry["id"].dump() + " is not a whole number in [0, 2^31)",
             "token ids are non-negative integers below 2^31");
    }
    for (const char* flag : {"lstrip", "rstrip", "single_word"}) {
      if (entry.value(flag, false)) {
        refuse(path, field + "." + flag, std::string(flag) + " true is not supported",
               "the GPT-2, Llama 3 and Qwen2 tokenizers set lstrip, rstrip and single_word false");
      }
    }
    BpeAddedToken token{entry["content"].get<std::string>(), entry["id"].get<std::uint32_t>()};
    tokenizer.vocab_size = std::max<std::int64_t>(tokenizer.vocab_size, std::int64_t{token.id} + 1);
    tokenizer.added_token_first_bytes[static_cast<unsigned char>(token.content[0])] = true;
    tokenizer.added_tokens.push_back(std::move(token));
  }
  std::stable_sort(tokenizer.added_tokens.begin(), tokenizer.added_tokens.end(),
                   [](const BpeAddedToken& a, const BpeAddedToken& b) { return a.content.size() > b.content.size(); });
}

}  // namespace

std::string bpe_byte_symbol(unsigned char byte) { return utf8_encode(kByteSymbols[byte]); }

BpeTokenizer bpe_tokenizer_load(const std::string& path) {
  json root = json_read(path);
  if (!root.contains("model") || !root["model"].is_object()) {
    refuse(path, "model", "no model object", "pass the tokenizer.json of a Hugging Face model");
  }
  const json& model = root["model"];
  BpeTokenizer tokenizer;
  try {
    model_check_options(path, model);
    tokenizer.normalize_nfc = normalizer_is_nfc(path, root);
    tokenizer.pattern = pre_tokenizer_pattern(path, root);
    tokenizer.ignore_merges = model.value("ignore_merges", false);
    vocab_read(path, model, tokenizer);
    merges_read(path, model, tokenizer);
    added_tokens_read(path, root, tokenizer);
  } catch (const json::exception& e) {
    // A field of the wrong JSON type (a string where a number belongs, ...).
    throw Error(std::string("unexpected JSON type: ") + e.what(), io_where(path),
                "use the tokenizer.json the model was trained with");
  }
  return tokenizer;
}

}  // namespace alloy
