#!/usr/bin/python3
"""Writes the byte-level BPE fixtures of tests/io/bpe/: a small BPE trained here on the example
text plus some non-ASCII lines, saved as tokenizer.json files in Hugging Face's layout for the
GPT-2, Llama 3 and Qwen2 families (their pre-tokenizer patterns, merge formats and options).

Usage: /usr/bin/python3 scripts/bpe_fixtures.py   (needs python3-regex; deterministic output)
"""
import collections
import json
import pathlib

import regex

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "io" / "bpe"
MERGES = 1000

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                  r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                 r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")

# Lines the tests tokenize besides the example text: accents (some decomposed, which NFC
# composes), CJK, emoji with modifiers and joiners, digit runs, contractions in all cases,
# CRLF, tabs, unusual spaces, trailing spaces and the special token written literally.
UNICODE_LINES = [
    "Café crème brûlée à la carte: naïve résumé, Ærøskøbing, Åsa, Ørsted.\n",
    "Decomposed accents: cafe\u0301, re\u0301sume\u0301, A\u030asa (NFC composes them).\n",
    "東京の天気は晴れです。我们明天去北京。한국어 문장도 있습니다.\n",
    "Emoji 😀🚀 thumbs 👍🏽 family 👨\u200d👩\u200d👧 flags 🇫🇷🇯🇵!\n",
    "Digits 1234567890 and 3.14159, 2026-12-03, 1,000,000; Arabic-Indic ١٢٣٤٥; Roman ⅫⅣ; half ½.\n",
    "Contractions: I'm you're we've they'll she'd it's don't can't.\n",
    "SHOUTING: I'M YOU'RE WE'VE THEY'LL SHE'D IT'S DON'T; Mixed: It'S We'Ve They'Ll; long s: it'ſ.\n",
    "Windows line one\r\nWindows line two\r\n\r\nafter a blank CRLF line\r\n",
    "\tTabbed\tcolumns\there,  double  spaces   and   triple.\n",
    "trailing spaces   \n",
    "  indented  twice\n\n\n   three newlines above\n",
    "Symbols <<>> !!! ??? ... ### $$$ %%% ™ © ® ° ± × ÷ → ∑.\n",
    "Greek Καλημέρα κόσμε; Cyrillic Привет, мир! Hebrew שלום; Arabic مرحبا.\n",
    "Mixed abcДЕЖ123xyz and word123word 12ab34.\n",
    "Spaces: no\u00a0break, ideographic\u3000space, next\u0085line, thin\u2009space.\n",
    "first document<|endoftext|>second document<|im_start|>user\n",
    "'quoted' \"double\" 'S 'T 'RE 'LL 'D 'x '\n",
]


def bytes_to_unicode():
    """GPT-2's alphabet: printable Latin-1 bytes stand for themselves, the rest for 256, 257, ..."""
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    table = {}
    extra = 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


def train_merges(text, pattern, count):
    """Greedy BPE training: repeatedly merges the most frequent neighbouring pair (ties: the
    smallest pair) over the pre-tokens of `text`."""
    alphabet = bytes_to_unicode()
    words = collections.Counter()
    for piece in regex.findall(pattern, text):
        words[tuple(alphabet[b] for b in piece.encode("utf-8"))] += 1
    merges = []
    for _ in range(count):
        pairs = collections.Counter()
        for word, freq in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += freq
        if not pairs:
            break
        best = min(pairs, key=lambda pair: (-pairs[pair], pair))
        merges.append(best)
        merged = collections.Counter()
        for word, freq in words.items():
            out = []
            i = 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += freq
        words = merged
    return merges


def vocab_of(merges):
    alphabet = bytes_to_unicode()
    vocab = {alphabet[b]: i for i, b in enumerate(sorted(alphabet, key=lambda b: ord(alphabet[b])))}
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    return vocab


def added(token_id, content):
    return {"id": token_id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}


def split_pre_tokenizer(pattern, trim_offsets):
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": trim_offsets, "use_regex": False}]}


def model_of(vocab, merges, pair_form, ignore_merges):
    return {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": ignore_merges,
            "vocab": vocab, "merges": [[a, b] if pair_form else f"{a} {b}" for a, b in merges]}


def tokenizer_json(added_tokens, normalizer, pre_tokenizer, model):
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added_tokens,
            "normalizer": normalizer, "pre_tokenizer": pre_tokenizer, "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": model}


def gpt2_fixture(text):
    merges = train_merges(text, GPT2_PATTERN, MERGES)
    vocab = vocab_of(merges)
    end = len(vocab)
    vocab["<|endoftext|>"] = end  # GPT-2 keeps its one special token in the vocabulary too
    added_tokens = [added(end, "<|endoftext|>"), added(end + 1, "<|im_start|>")]
    pre = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return tokenizer_json(added_tokens, None, pre, model_of(vocab, merges, False, False))


def llama3_fixture(text):
    merges = train_merges(text, LLAMA3_PATTERN, MERGES)
    vocab = vocab_of(merges)
    # Whole words without merges that make them: only ignore_merges emits them as one token.
    alphabet = bytes_to_unicode()
    for word in [" license", " software", " Library", " copyright", "東京"]:
        vocab.setdefault("".join(alphabet[b] for b in word.encode("utf-8")), len(vocab))
    # Llama 3's special tokens sit above its 128000 ordinary ones: uint32 token files.
    added_tokens = [added(128000, "<|begin_of_text|>"), added(128001, "<|endoftext|>"),
                    added(128002, "<|im_start|>"), added(128003, "<|end")]
    return tokenizer_json(added_tokens, None, split_pre_tokenizer(LLAMA3_PATTERN, True),
                          model_of(vocab, merges, True, True))


def qwen2_fixture(text):
    merges = train_merges(text, QWEN2_PATTERN, MERGES)
    vocab = vocab_of(merges)
    added_tokens = [added(151643, "<|endoftext|>"), added(151644, "<|im_start|>"), added(151645, "<|im_end|>")]
    return tokenizer_json(added_tokens, {"type": "NFC"}, split_pre_tokenizer(QWEN2_PATTERN, False),
                          model_of(vocab, merges, True, False))


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    lines = "".join(UNICODE_LINES)
    (OUT / "unicode_lines.txt").write_bytes(lines.encode("utf-8"))
    corpus = "".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "examples" / "data").glob("*.txt")))
    corpus += lines * 20  # enough repeats for some non-ASCII merges
    for name, make in [("gpt2", gpt2_fixture), ("llama3", llama3_fixture), ("qwen2", qwen2_fixture)]:
        path = OUT / f"{name}_tokenizer.json"
        path.write_text(json.dumps(make(corpus), ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
