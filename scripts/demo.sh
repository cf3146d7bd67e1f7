#!/usr/bin/env bash
# Installs what is missing, builds, and runs Alloy's main jobs on built-in examples:
# check a model and a heterogeneous cluster, plan, simulate with a timeline, and train a tiny
# model on this machine. Outputs go to out/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh release >/dev/null
alloy=build/alloy
out=out/demo
mkdir -p "$out"

echo "== 1. alloy check: LLaMA-2-7B on 16 x A100-80GB + 16 x V100-32GB over InfiniBand"
$alloy check --model llama-2-7b --cluster a100-v100 --train examples/train/llama-pretrain.yaml

echo
echo "== 2. alloy plan: the fastest layout that fits, and why"
$alloy plan --model llama-2-7b --cluster a100-v100 --train examples/train/llama-pretrain.yaml \
  -o "$out/plan.json" --report "$out/report.html"

echo
echo "== 3. alloy simulate: the plan replayed event by event"
$alloy simulate --plan "$out/plan.json" --trace "$out/trace.json"

echo
echo "== 4. alloy train: a tiny GPT on byte-level English, one rank on this CPU"
$alloy tokenize examples/data/fsf_licenses.txt -o "$out/fsf.bin" --val-fraction 0.1
$alloy train --model tiny-gpt --data "$out/fsf_train.bin" --val-data "$out/fsf_val.bin" \
  --train examples/train/tiny-cpu.yaml --steps 60 --val-every 20 --log "$out/train.jsonl"

echo
echo "demo outputs in $out/: plan.json, report.html (open in a browser), trace.json (ui.perfetto.dev), train.jsonl"
