#!/usr/bin/env bash
# Configures and builds one configuration. Usage: scripts/build.sh [release|asan|cuda]
# release also builds the CUDA backend when nvcc is installed (ALLOY_CUDA=OFF in the
# environment turns that off); cuda builds it into build-cuda/ and fails without nvcc.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-release}
jobs=$(nproc)
cuda_flag=OFF
nvcc_path=$(command -v nvcc || true)
if [ -z "$nvcc_path" ] && [ -x /usr/local/cuda/bin/nvcc ]; then nvcc_path=/usr/local/cuda/bin/nvcc; fi
if [ "${ALLOY_CUDA:-auto}" != OFF ] && [ -n "$nvcc_path" ]; then
  cuda_flag=ON
  export CUDACXX=${CUDACXX:-$nvcc_path}
fi
case "$kind" in
  release)
    # -O2 without debug info, and the library and CLI compiled in batches (ALLOY_UNITY; set it
    # to OFF in the environment for quicker incremental rebuilds), keep the build short on CI's
    # two cores: 3.6 min here against about 5.
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" \
      -DALLOY_WERROR=ON -DALLOY_CUDA="$cuda_flag" -DALLOY_UNITY="${ALLOY_UNITY:-ON}" >/dev/null
    cmake --build build -j"$jobs"
    ;;
  asan)
    # -O1 keeps the sanitized tests fast enough for CI; -g1 (line tables) is enough for the
    # sanitizers' stack traces; benchmarks are not built here.
    cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-g1 -O1" \
      -DALLOY_SANITIZE=ON -DALLOY_WERROR=ON -DALLOY_BENCH=OFF >/dev/null
    cmake --build build-asan -j"$jobs"
    ;;
  cuda)
    if [ "$cuda_flag" != ON ]; then
      echo "scripts/build.sh cuda: nvcc not found; install the CUDA toolkit (nvcc, cuBLAS, NCCL)" >&2
      exit 2
    fi
    cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" \
      -DALLOY_WERROR=ON -DALLOY_CUDA=ON ${ALLOY_CUDA_ARCHITECTURES:+-DALLOY_CUDA_ARCHITECTURES="$ALLOY_CUDA_ARCHITECTURES"} >/dev/null
    cmake --build build-cuda -j"$jobs"
    ;;
  *)
    echo "usage: scripts/build.sh [release|asan|cuda]" >&2
    exit 2
    ;;
esac
