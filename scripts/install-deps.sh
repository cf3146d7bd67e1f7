#!/usr/bin/env bash
# Installs the Debian packages Alloy needs, only those missing; silent when all are present.
# Usage: scripts/install-deps.sh [extra-package ...]
set -euo pipefail

packages=(
  g++ cmake ninja-build pkg-config
  libopenblas-dev libopenmpi-dev openmpi-bin
  nlohmann-json3-dev libyaml-cpp-dev libcli11-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev zlib1g-dev
  # Unicode classes and NFC for `alloy tokenize --tokenizer` (byte-level BPE pre-tokenizers).
  libicu-dev
  chromium
  # PyTorch for the reference checks (tests read what it writes and it reads what Alloy writes;
  # scripts/golden.py and scripts/hf_fixtures.py make the fixtures with it): about half a minute.
  python3-torch
  # Python's `regex` (\p{L}, \p{N}) for the BPE reference tokenizer (tests/io/bpe/reference_bpe.py).
  python3-regex
  "$@"
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing missing packages: ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
