// The pre-tokenizer regexes of the GPT-2, Llama 3 and Qwen2 tokenizers, matched by hand: each
// splits text into the pieces BPE then encodes one by one, exactly as Python's `regex` would.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace alloy {

enum class PretokenPattern {
  PretokenPattern_gpt2,    // contractions, letters, digits (any count), symbols, spaces
  PretokenPattern_llama3,  // case-insensitive contractions, digits in groups of up to 3
  PretokenPattern_qwen2,   // as Llama 3, but digits one by one
};

// The pattern string as it appears in tokenizer.json ("Regex" of a Split pre-tokenizer; for
// GPT-2 the one built into ByteLevel with use_regex true).
std::string_view pretoken_pattern_regex(PretokenPattern pattern);
// The pattern whose string is exactly `regex`, or nothing.
std::optional<PretokenPattern> pretoken_pattern_from_regex(std::string_view regex);
// "GPT-2, Llama 3, Qwen2": for error messages.
std::string pretoken_pattern_names();

// End of the pre-token that starts at `begin` (< text.size()) in `text`, which is one whole
// piece between added tokens: the pattern's lookahead stops at its end.
std::size_t pretoken_end(PretokenPattern pattern, std::string_view text, std::size_t begin);

}  // namespace alloy
