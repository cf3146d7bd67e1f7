#!/usr/bin/env bash
# Installs what is missing, builds, and runs Alloy's main job on built-in examples.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
scripts/install-deps.sh
scripts/build.sh release >/dev/null
alloy=build/alloy

echo "== alloy check: LLaMA-2-7B on a cluster of A100-80GB and V100-32GB nodes"
$alloy check --model llama-2-7b --cluster a100-v100 --train examples/train/llama-pretrain.yaml
