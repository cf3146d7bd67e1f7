#!/usr/bin/env bash
# Builds and runs the benchmarks; each prints its ratios measured side by side in one run.
# Usage: scripts/bench.sh [train|planner|sim|io|prediction|heterogeneity ...]   (default: all)
# Installs Debian's python3-torch for the PyTorch comparison of the trainer.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh python3-torch python3-numpy
scripts/build.sh release >/dev/null
which=("$@")
[ ${#which[@]} -eq 0 ] && which=(train planner sim io prediction heterogeneity)
for b in "${which[@]}"; do
  case "$b" in
    train) echo "== trainer against PyTorch"; build/bench_train_vs_torch --steps 5 --rounds 5 --threads 1,2 ;;
    planner) echo "== planner"; build/bench_planner --runs 5 ;;
    sim) echo "== simulator"; build/bench_sim ;;
    io) echo "== data and checkpoint I/O"; build/io_bench ;;
    prediction) echo "== predicted against measured (profile, plan, mpirun)"; build/bench_prediction --steps 8 --rounds 5 ;;
    heterogeneity) echo "== Alloy's plan against a uniform plan on unequal devices (mpirun)"; build/bench_heterogeneity --steps 8 --rounds 3 ;;
    *) echo "unknown benchmark '$b' (use train, planner, sim, io, prediction, heterogeneity)" >&2; exit 2 ;;
  esac
done
