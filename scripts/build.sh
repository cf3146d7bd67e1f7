#!/usr/bin/env bash
# Configures and builds one configuration. Usage: scripts/build.sh [release|asan]
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-release}
jobs=$(nproc)
case "$kind" in
  release)
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DALLOY_WERROR=ON >/dev/null
    cmake --build build -j"$jobs"
    ;;
  asan)
    # -O1 keeps the sanitized tests fast enough for CI; benchmarks are not built here.
    cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-g -O1" \
      -DALLOY_SANITIZE=ON -DALLOY_WERROR=ON -DALLOY_BENCH=OFF >/dev/null
    cmake --build build-asan -j"$jobs"
    ;;
  *)
    echo "usage: scripts/build.sh [release|asan]" >&2
    exit 2
    ;;
esac
