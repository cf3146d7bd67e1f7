#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test: the release build (warnings as errors)
# first, then the AddressSanitizer + UndefinedBehaviorSanitizer build.
# ALLOY_SKIP_ASAN=1 skips the sanitizer pass (quicker local runs; CI always runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

scripts/install-deps.sh
start=$(date +%s)

echo "== release build"
scripts/build.sh release
echo "== release tests"
(cd build && ctest --output-on-failure -j"$(nproc)" --timeout 900)

if [ "${ALLOY_SKIP_ASAN:-0}" != "1" ]; then
  echo "== sanitizer build"
  scripts/build.sh asan
  echo "== sanitizer tests"
  # Tests labelled 'slow' (long training and multi-rank runs) run in the release pass only.
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest --output-on-failure -j"$(nproc)" --timeout 900 -LE slow)
fi
echo "== all tests passed in $(( $(date +%s) - start )) s"
