// Byte-level BPE encoding: added tokens, pre-tokens, then merges by rank within each
// pre-token (see bpe_tokenizer.hpp).
#include <algorithm>

#include <fmt/format.h>

#include "runtime/io/bpe_tokenizer.hpp"
#include "runtime/io/file_io.hpp"
#include "runtime/io/unicode_text.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace {

// Pre-tokens longer than this are merged every time rather than cached: they are rare (long
// runs of spaces or symbols) and would fill the cache with one-off entries.
constexpr std::size_t kCachedPretokenMostBytes = 64;
// The cache is emptied when it holds this many pre-tokens, which bounds its memory on huge
// inputs with many distinct words while keeping the common ones after a refill.
constexpr std::size_t kCacheMostEntries = 1 << 16;
// Merging a pre-token holds about 32 bytes per byte of it (symbols and candidates); one longer
// than this (a blob of letters without a break) is refused rather than exhausting memory.
constexpr std::size_t kLongestPretokenBytes = std::size_t{16} << 20;
// The id of a symbol merged into its left neighbour: no candidate names it any more.
constexpr std::uint32_t kAbsorbedSymbol = 0xFFFFFFFF;

// Min-heap order: lowest rank first, and the leftmost pair among equal ranks, as Hugging Face.
constexpr auto kCandidateAfter = [](const auto& a, const auto& b) {
  return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
};

}  // namespace

BpeTextEncoder::BpeTextEncoder(const BpeTokenizer& tokenizer, std::string_view text)
    : tokenizer_(tokenizer), text_(text) {
  find_next_added_token();
}

void BpeTextEncoder::find_next_added_token() {
  next_added_ = nullptr;
  for (std::size_t pos = position_; pos < text_.size(); ++pos) {
    if (!tokenizer_.added_token_first_bytes[static_cast<unsigned char>(text_[pos])]) continue;
    for (const BpeAddedToken& added : tokenizer_.added_tokens) {
      if (text_.compare(pos, added.content.size(), added.content) == 0) {
        next_added_ = &added;
        segment_end_ = pos;
        return;
      }
    }
  }
  segment_end_ = text_.size();
}

std::size_t BpeTextEncoder::encode_until(std::size_t stop_byte, std::vector<std::uint32_t>& out) {
  while (position_ < stop_byte && position_ < text_.size()) {
    if (position_ == segment_end_) {
      out.push_back(next_added_->id);
      position_ += next_added_->content.size();
      find_next_added_token();
      continue;
    }
    // The segment up to the next added token is a whole text to the pattern: its lookahead
    // (`\s+(?!\S)`) must not see past it.
    std::string_view segment = text_.substr(0, segment_end_);
    std::size_t end = pretoken_end(tokenizer_.pattern, segment, position_);
    encode_pretoken(segment.substr(position_, end - position_), out);
    position_ = end;
  }
  return position_;
}

void BpeTextEncoder::encode_pretoken(std::string_view pretoken, std::vector<std::uint32_t>& out) {
  if (pretoken.size() > kLongestPretokenBytes) {
    throw Error(fmt::format("a piece of {} bytes without a break at byte {} of the text is longer than the {} MiB "
                            "the BPE encoder merges at once",
                            pretoken.size(), static_cast<std::size_t>(pretoken.data() - text_.data()),
                            kLongestPretokenBytes >> 20),
                io_where("", ""), "split such runs (e.g. embedded base64 data) out of the text before tokenizing");
  }
  if (tokenizer_.ignore_merges) {
    auto whole = tokenizer_.ids_by_bytes.find(pretoken);
    if (whole != tokenizer_.ids_by_bytes.end()) {
      out.push_back(whole->second);
      return;
    }
  }
  if (pretoken.size() > kCachedPretokenMostBytes) {
    merge_pretoken(pretoken, out);
    return;
  }
  auto cached = cache_.find(pretoken);
  if (cached == cache_.end()) {
    if (cache_.size() >= kCacheMostEntries) cache_.clear();
    std::vector<std::uint32_t> tokens;
    merge_pretoken(pretoken, tokens);
    cached = cache_.emplace(std::string(pretoken), std::move(tokens)).first;
  }
  out.insert(out.end(), cached->second.begin(), cached->second.end());
}

void BpeTextEncoder::push_candidate(std::uint32_t left) {
  std::uint32_t right = symbols_[left].next;
  if (right == symbols_.size()) return;
  auto merge = tokenizer_.merges.find(bpe_pair_key(symbols_[left].id, symbols_[right].id));
  if (merge == tokenizer_.merges.end()) return;
  candidates_.push_back({merge->second.rank, left, symbols_[left].id, symbols_[right].id, merge->second.merged_id});
  std::push_heap(candidates_.begin(), candidates_.end(), kCandidateAfter);
}

// Starts from one symbol per byte and applies the lowest-ranked merge of two neighbours until
// none applies. A merged pair folds into its left symbol and the right one is marked absorbed.
// A candidate is stale when either of its symbols has changed since it was pushed: merging
// gives a symbol a longer token, so comparing ids tells.
void BpeTextEncoder::merge_pretoken(std::string_view pretoken, std::vector<std::uint32_t>& out) {
  symbols_.clear();
  candidates_.clear();
  const auto count = static_cast<std::uint32_t>(pretoken.size());
  for (std::uint32_t i = 0; i < count; ++i) {
    symbols_.push_back({tokenizer_.byte_ids[static_cast<unsigned char>(pretoken[i])], i - 1, i + 1});
  }
  for (std::uint32_t i = 0; i + 1 < count; ++i) push_candidate(i);
  while (!candidates_.empty()) {
    std::pop_heap(candidates_.begin(), candidates_.end(), kCandidateAfter);
    MergeCandidate best = candidates_.back();
    candidates_.pop_back();
    Symbol& left = symbols_[best.left];
    if (left.id != best.left_id || left.next == count || symbols_[left.next].id != best.right_id) continue;
    Symbol& right = symbols_[left.next];
    right.id = kAbsorbedSymbol;
    left.id = best.merged_id;
    left.next = right.next;
    if (left.next != count) symbols_[left.next].previous = best.left;
    push_candidate(best.left);
    if (best.left != 0) push_candidate(left.previous);
  }
  for (std::uint32_t i = 0; i < count; i = symbols_[i].next) out.push_back(symbols_[i].id);
}

std::string_view bpe_normalized(const BpeTokenizer& tokenizer, std::string_view text, std::string& storage) {
  if (!tokenizer.normalize_nfc || text_is_nfc(text)) return text;
  storage = text_to_nfc(text);
  return storage;
}

std::vector<std::uint32_t> bpe_encode(const BpeTokenizer& tokenizer, std::string_view text) {
  std::string storage;
  std::string_view normalized = bpe_normalized(tokenizer, text, storage);
  std::vector<std::uint32_t> tokens;
  BpeTextEncoder encoder(tokenizer, normalized);
  encoder.encode_until(normalized.size(), tokens);
  return tokens;
}

}  // namespace alloy
