#!/usr/bin/python3
"""Reference byte-level BPE tokenizer for the tests: reads a Hugging Face tokenizer.json and a
text file, and writes the token ids as little-endian uint32. Written independently of Alloy's
C++ with Python's `regex` module and the literal pattern strings of the tokenizer.json.

Usage: reference_bpe.py TOKENIZER_JSON INPUT_TEXT OUTPUT_U32   (exit 77 when `regex` is missing)
"""
import json
import struct
import sys
import unicodedata

try:
    import regex
except ImportError:
    sys.exit(77)

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def byte_alphabet():
    printable = set(range(33, 127)) | set(range(161, 173)) | set(range(174, 256))
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


class Reference:
    def __init__(self, config):
        model = config["model"]
        self.vocab = model["vocab"]
        self.ranks = {}
        for rank, merge in enumerate(model["merges"]):
            pair = tuple(merge) if isinstance(merge, list) else tuple(merge.split(" "))
            self.ranks.setdefault(pair, rank)
        self.ignore_merges = model.get("ignore_merges", False)
        self.nfc = (config.get("normalizer") or {}).get("type") == "NFC"
        pre = config["pre_tokenizer"]
        if pre["type"] == "ByteLevel":
            pattern = GPT2_PATTERN
        else:
            pattern = pre["pretokenizers"][0]["pattern"]["Regex"]
        self.pattern = regex.compile(pattern)
        added = sorted(config["added_tokens"], key=lambda t: -len(t["content"]))
        self.added_ids = {t["content"]: t["id"] for t in added}
        self.added_pattern = regex.compile("|".join(regex.escape(t["content"]) for t in added)) if added else None
        self.alphabet = byte_alphabet()
        self.cache = {}

    def merge(self, piece):
        symbols = [self.alphabet[b] for b in piece.encode("utf-8")]
        while len(symbols) > 1:
            # the lowest-ranked neighbouring pair, the leftmost among equals
            best = min(range(len(symbols) - 1),
                       key=lambda i: (self.ranks.get((symbols[i], symbols[i + 1]), float("inf")), i))
            if (symbols[best], symbols[best + 1]) not in self.ranks:
                break
            symbols[best:best + 2] = [symbols[best] + symbols[best + 1]]
        return [self.vocab[s] for s in symbols]

    def encode_piece(self, piece):
        if piece not in self.cache:
            whole = "".join(self.alphabet[b] for b in piece.encode("utf-8"))
            if self.ignore_merges and whole in self.vocab:
                self.cache[piece] = [self.vocab[whole]]
            else:
                self.cache[piece] = self.merge(piece)
        return self.cache[piece]

    def encode(self, text):
        if self.nfc:
            text = unicodedata.normalize("NFC", text)
        ids = []
        segments = self.added_pattern.split(text) if self.added_pattern else [text]
        specials = self.added_pattern.findall(text) if self.added_pattern else []
        for k, segment in enumerate(segments):
            for piece in self.pattern.findall(segment):
                ids.extend(self.encode_piece(piece))
            if k < len(specials):
                ids.append(self.added_ids[specials[k]])
        return ids


def main():
    tokenizer_path, input_path, output_path = sys.argv[1:4]
    with open(tokenizer_path, encoding="utf-8") as f:
        reference = Reference(json.load(f))
    with open(input_path, "rb") as f:
        text = f.read().decode("utf-8")
    ids = reference.encode(text)
    with open(output_path, "wb") as f:
        f.write(struct.pack(f"<{len(ids)}I", *ids))


if __name__ == "__main__":
    main()
