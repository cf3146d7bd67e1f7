#!/usr/bin/env bash
# Installs what is missing, builds, and runs Alloy's main jobs on built-in examples:
# check a model and a heterogeneous cluster, plan, simulate with a timeline, train a tiny model
# on this machine, then plan a small model for the 4-rank local CPU cluster and run that plan
# with mpirun. Outputs go to out/demo/.
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
echo "== 5. alloy profile, plan, mpirun alloy train --plan: a small GPT on the 4-rank local CPU cluster"
echo "   (two fast ranks and two emulated half-speed ranks; layer offload is not run on CPUs yet)"
export OMPI_MCA_rmaps_base_oversubscribe=1
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
mpirun -np 4 --bind-to none $alloy profile --model small-gpt --cluster local-cpu-4 \
  --train examples/train/tiny-cpu.yaml -o "$out/profile-cpu.json" | tail -n 3
$alloy plan --model small-gpt --cluster local-cpu-4 --train examples/train/tiny-cpu.yaml --no-offload \
  --profile "$out/profile-cpu.json" -o "$out/plan-cpu.json" > "$out/plan-cpu.txt"
sed -n '1,8p' "$out/plan-cpu.txt"
# "Plan for small-gpt on local-cpu-4 (4 of 4 devices), ...": one rank per device the plan uses.
ranks=$(sed -n '1s/.*(\([0-9]*\) of [0-9]* devices).*/\1/p' "$out/plan-cpu.txt")
mpirun -np "$ranks" --bind-to none $alloy train --plan "$out/plan-cpu.json" \
  --data "$out/fsf_train.bin" --steps 8 \
  --log "$out/train-cpu.jsonl" --trace "$out/trace-cpu.json" \
  --profile "$out/profile-cpu.json" --calibrated-profile "$out/profile-cpu-calibrated.json"

echo
echo "demo outputs in $out/: plan.json, report.html (open in a browser), trace.json (ui.perfetto.dev), train.jsonl,"
echo "  profile-cpu.json, plan-cpu.json, train-cpu.jsonl, trace-cpu.json (the real run's last step, same format as"
echo "  trace.json) and profile-cpu-calibrated.json (the profile corrected by the run, for the next alloy plan)"
