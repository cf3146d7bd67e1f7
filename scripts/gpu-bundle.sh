#!/usr/bin/env bash
# Usage: scripts/gpu-bundle.sh [BUILD_DIR] (default build-cuda; `build` when scripts/build.sh
# release found nvcc). Unpack into the same folder name on the other machine: the tests know
# their helpers' paths.
# Packs the CUDA build for a GPU machine that has the NVIDIA driver and CUDA libraries but none
# of Alloy's other dependencies: the stripped binaries of build-cuda/ and every shared library
# they load from this system (except the C library, the loader and CUDA's own), as
# .gpu-bundle.tgz. On the GPU machine:
#   mkdir -p BUILD_DIR && tar xzf .gpu-bundle.tgz -C BUILD_DIR
#   (remove from BUILD_DIR/lib what `ldconfig -p` already lists there)
#   export LD_LIBRARY_PATH=$PWD/BUILD_DIR/lib:<CUDA libraries>; ALLOY_GPU_BIN=BUILD_DIR scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-cuda}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib"
for exe in alloy test_cuda bench_matmul bench_kernels bench_attention comm_check_gpu; do
  [ -x "$dir/$exe" ] || continue
  strip -o "$stage/$exe" "$dir/$exe"
  ldd "$dir/$exe" | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libcu*|libnccl*|libnvidia*) ;;
      libstdc++.so*|libgcc_s.so*|libgomp.so*) ;;  # newer on any later system, and compatible
      *) cp -L -n "$lib" "$stage/lib/" ;;
    esac
  done
done
tar czf .gpu-bundle.tgz -C "$stage" .
ls -la .gpu-bundle.tgz
