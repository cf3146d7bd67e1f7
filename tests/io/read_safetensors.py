"""Reads a safetensors file into PyTorch tensors without Alloy, to prove Alloy's files load there.

Usage: read_safetensors.py FILE OUT_JSON. Parses the format by hand (struct + json), builds
torch tensors with torch.frombuffer, cross-checks with the `safetensors` package when installed,
and writes {"metadata": {...}, "tensors": {name: {"shape": [...], "values": [...]}}}.
Exits 77 when torch is missing so the calling test can skip.
"""
import json
import struct
import sys

try:
    import torch
except ImportError:
    sys.exit(77)


def read_by_hand(path):
    with open(path, "rb") as f:
        blob = f.read()
    (header_len,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + header_len].decode("utf-8"))
    data = blob[8 + header_len:]
    metadata = header.pop("__metadata__", {})
    tensors = {}
    end_max = 0
    for name, entry in header.items():
        assert entry["dtype"] == "F32", (name, entry["dtype"])
        begin, end = entry["data_offsets"]
        end_max = max(end_max, end)
        raw = bytearray(data[begin:end])
        flat = torch.frombuffer(raw, dtype=torch.float32) if raw else torch.empty(0)
        tensors[name] = flat.reshape(entry["shape"])
    assert end_max == len(data), "bytes after the last tensor"
    return metadata, tensors


def main():
    path, out_path = sys.argv[1], sys.argv[2]
    metadata, tensors = read_by_hand(path)
    try:
        from safetensors.torch import load_file
    except ImportError:
        load_file = None
    if load_file is not None:
        reference = load_file(path)
        assert reference.keys() == tensors.keys()
        for name, tensor in tensors.items():
            assert torch.equal(reference[name], tensor), name
    out = {
        "metadata": metadata,
        "checked_with_safetensors_package": load_file is not None,
        "tensors": {
            name: {"shape": list(t.shape), "values": t.flatten().double().tolist()}
            for name, t in tensors.items()
        },
    }
    with open(out_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
