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
  # The longest runs repeat code paths other sanitized tests cover, so they run in the release
  # pass only (CI's 15 minutes): a long training run, the brute-force search comparison, every
  # shipped cluster through plan/simulate/report, data parallelism at all four ZeRO stages, and
  # five offload variants of one pipeline (tests/runtime/offload_test.cpp sanitizes both engines).
  release_only='Trainer.TinyGptLearnsEnglishBytes|Exhaustive.PlannerMatchesBruteForce|PlanCli.EveryShippedCluster'
  release_only+='|DistTest.DataParallelAtEveryZeroStage|OffloadTest.LossesAndWeightsAreBitIdentical'
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest --output-on-failure -j"$(nproc)" --timeout 900 -E "$release_only")
fi
echo "== all tests passed in $(( $(date +%s) - start )) s"
