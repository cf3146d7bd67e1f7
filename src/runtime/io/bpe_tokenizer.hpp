// Byte-level BPE tokenizers in Hugging Face's tokenizer.json format (GPT-2, Llama 3 and Qwen2
// families): loading with clear refusals of what is not supported, and encoding text to ids.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "runtime/io/pretokenize.hpp"

namespace alloy {

// Hashes std::string and std::string_view alike, so maps keyed by std::string are searched
// with views of the text without copying them.
struct TextHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
};

using IdsByBytes = std::unordered_map<std::string, std::uint32_t, TextHash, std::equal_to<>>;

struct BpeMerge {
  std::uint32_t rank = 0;       // position in model.merges: lower merges first
  std::uint32_t merged_id = 0;  // the token the pair becomes
};

// An entry of added_tokens (special tokens such as "<|endoftext|>"): matched literally in the
// text, longest first, before pre-tokenization, as Hugging Face does.
struct BpeAddedToken {
  std::string content;
  std::uint32_t id = 0;
};

struct BpeTokenizer {
  PretokenPattern pattern = PretokenPattern::PretokenPattern_gpt2;
  bool normalize_nfc = false;                 // normalizer {"type": "NFC"} (Qwen2)
  bool ignore_merges = false;                 // a pre-token that is itself in the vocabulary is one token (Llama 3)
  std::array<std::uint32_t, 256> byte_ids{};  // the token of each single byte
  IdsByBytes ids_by_bytes;                    // raw bytes of each vocabulary token
  std::unordered_map<std::uint64_t, BpeMerge> merges;  // by bpe_pair_key(left, right)
  std::vector<BpeAddedToken> added_tokens;             // longest first
  std::array<bool, 256> added_token_first_bytes{};     // bytes some added token starts with
  std::int64_t vocab_size = 0;                         // largest id + 1
};

inline std::uint64_t bpe_pair_key(std::uint32_t left, std::uint32_t right) {
  return (static_cast<std::uint64_t>(left) << 32) | right;
}

// The token string of `byte` in GPT-2's byte-to-unicode alphabet (UTF-8), e.g. ' ' -> "Ġ".
std::string bpe_byte_symbol(unsigned char byte);

// Reads and checks a tokenizer.json. Throws alloy::Error naming the file and the JSON field for
// anything but a byte-level BPE model with one of the supported pre-tokenizer patterns.
BpeTokenizer bpe_tokenizer_load(const std::string& path);

// Encodes one text front to back, piece by piece (added tokens and pre-tokens), so a caller can
// stop at a byte offset (to split off validation data, or report progress). Keeps a cache of
// the tokens of each pre-token it has seen; the text must outlive the encoder.
class BpeTextEncoder {
 public:
  BpeTextEncoder(const BpeTokenizer& tokenizer, std::string_view text);

  // Appends the tokens of the pieces that start before `stop_byte`; returns where the next
  // piece starts (>= stop_byte, or the text's size when done).
  std::size_t encode_until(std::size_t stop_byte, std::vector<std::uint32_t>& out);

 private:
  struct Symbol {
    std::uint32_t id;
    std::uint32_t previous;  // index of the previous live symbol (unused for the first, which stays first)
    std::uint32_t next;      // index of the next live symbol; the count when last
  };
  struct MergeCandidate {
    std::uint32_t rank;
    std::uint32_t left;  // index of the left symbol
    std::uint32_t left_id;
    std::uint32_t right_id;
    std::uint32_t merged_id;
  };

  void find_next_added_token();
  void encode_pretoken(std::string_view pretoken, std::vector<std::uint32_t>& out);
  void merge_pretoken(std::string_view pretoken, std::vector<std::uint32_t>& out);
  void push_candidate(std::uint32_t left);

  const BpeTokenizer& tokenizer_;
  std::string_view text_;
  std::size_t position_ = 0;
  std::size_t segment_end_ = 0;  // where the next added token starts, or the text's size
  const BpeAddedToken* next_added_ = nullptr;
  std::unordered_map<std::string, std::vector<std::uint32_t>, TextHash, std::equal_to<>> cache_;
  std::vector<Symbol> symbols_;
  std::vector<MergeCandidate> candidates_;  // a min-heap by (rank, left)
};

// `text` as the tokenizer's normalizer leaves it: `text` itself, or its NFC form in `storage`.
// Added tokens are matched after normalization (they are ASCII in the supported families).
std::string_view bpe_normalized(const BpeTokenizer& tokenizer, std::string_view text, std::string& storage);

// All tokens of `text` (normalized first): what Hugging Face's encode(text,
// add_special_tokens=False) gives.
std::vector<std::uint32_t> bpe_encode(const BpeTokenizer& tokenizer, std::string_view text);

}  // namespace alloy
