#!/usr/bin/env bash
# Configures and builds one configuration. Usage: scripts/build.sh [release|asan]
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-release}
jobs=$(nproc)
case "$kind" in
  release)
    # -O2 without debug info keeps the build short on CI's two cores.
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" \
      -DALLOY_WERROR=ON >/dev/null
    cmake --build build -j"$jobs"
    ;;
  asan)
    # -O1 keeps the sanitized tests fast enough for CI; -g1 (line tables) is enough for the
    # sanitizers' stack traces; benchmarks are not built here.
    cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-g1 -O1" \
      -DALLOY_SANITIZE=ON -DALLOY_WERROR=ON -DALLOY_BENCH=OFF >/dev/null
    cmake --build build-asan -j"$jobs"
    ;;
  *)
    echo "usage: scripts/build.sh [release|asan]" >&2
    exit 2
    ;;
esac
