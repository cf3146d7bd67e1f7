#!/usr/bin/env bash
# Fault trials of multi-rank checkpoints on 4 local ranks (MODEL, default tiny-gpt, one thread
# per rank, STEPS steps, default 40):
#   kill   N  each trial saves every step, waits until a random rank is writing a checkpoint,
#             sleeps a random 0 to MAX_DELAY_MS (default 30) ms and kill -9s it; then resumes
#             from what is committed and compares the resumed losses with an uninterrupted
#             run's (exactly). Each line says whether the kill cut a save short.
#   term      sends SIGTERM to rank 2 of a running job; prints the seconds until every rank has
#             exited, the exit status and the step saved
# Usage: scripts/checkpoint-faults.sh kill 20 | scripts/checkpoint-faults.sh term
# ALLOY (default build-dev/alloy) names the binary.
set -u
mode=${1:-kill}
trials=${2:-20}
root=$(cd "$(dirname "$0")/.." && pwd)
alloy=${ALLOY:-$root/build-dev/alloy}
work=$(mktemp -d /tmp/alloy-ckpt-faults.XXXXXX)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 ALLOY_THREADS=1
steps=${STEPS:-40}
"$alloy" tokenize "$root/examples/data/fsf_licenses.txt" -o "$work/data.bin" > /dev/null || exit 1

train() {  # train STEPS EXTRA...: 4 ranks, tagged so that their pids can be found
  local n=$1; shift
  ALLOY_RUN_TAG=$tag mpirun -np 4 --bind-to none -x ALLOY_RUN_TAG "$alloy" train --model "${MODEL:-tiny-gpt}" \
    --data "$work/data.bin" --steps "$n" --batch 8 --seq-len 32 --no-progress "$@"
}

rank_pid() {  # rank_pid RANK: the pid of that rank of the job tagged $tag
  local p
  for p in /proc/[0-9]*; do
    if { tr '\0' '\n' < "$p/environ" | grep -qx "ALLOY_RUN_TAG=$tag" &&
         tr '\0' '\n' < "$p/environ" | grep -qx "OMPI_COMM_WORLD_RANK=$1"; } 2> /dev/null; then
      echo "${p#/proc/}"; return
    fi
  done
}

losses() { python3 -c "import json,sys; [print(json.loads(l)['step'], repr(json.loads(l)['loss'])) for l in open(sys.argv[1])]" "$1"; }
committed_step() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]+'/latest.json'))['step'])" "$1" 2> /dev/null || echo none; }

if [ "$mode" = term ]; then
  tag=term-$$
  train 100000 --checkpoint "$work/ck" > "$work/term.txt" 2>&1 &
  job=$!
  until [ -n "$(rank_pid 2)" ]; do sleep 0.2; done
  sleep 5  # well into training
  pid=$(rank_pid 2)
  start=$(date +%s.%N)
  kill -TERM "$pid"
  wait "$job"; status=$?
  end=$(date +%s.%N)
  grep '^alloy: received' "$work/term.txt"
  echo "SIGTERM to rank 2 (pid $pid): all ranks exited after $(echo "$end - $start" | bc) s, exit status $status," \
       "committed step $(committed_step "$work/ck")"
  exit 0
fi

tag=ref-$$
train $steps --log "$work/ref.jsonl" > "$work/ref.txt" 2>&1 || { cat "$work/ref.txt"; exit 1; }
losses "$work/ref.jsonl" > "$work/ref.losses"
resumable=0; matching=0; compared=0; mid_save=0
trial=0; attempts=0
while [ "$trial" -lt "$trials" ] && [ "$attempts" -lt $((trials * 3)) ]; do
  attempts=$((attempts + 1))
  ck=$work/ck-$attempts; tag=kill-$$-$attempts
  rank=$((RANDOM % 4)); delay_ms=$((RANDOM % (${MAX_DELAY_MS:-30} + 1)))
  train $steps --checkpoint "$ck" --checkpoint-every 1 > "$work/kill-$attempts.txt" 2>&1 &
  job=$!
  # Wait for the first save to commit, then for this rank to be writing one.
  until [ -f "$ck/latest.json" ] || ! kill -0 "$job" 2> /dev/null; do sleep 0.05; done
  pid=$(rank_pid "$rank")
  until compgen -G "$ck/step-*/rank-0000$rank.tmp" > /dev/null || ! kill -0 "$job" 2> /dev/null; do :; done
  sleep "$(printf '%d.%03d' $((delay_ms / 1000)) $((delay_ms % 1000)))"
  if ! kill -9 "$pid" 2> /dev/null; then  # the run ended first: not a trial
    wait "$job"; continue
  fi
  wait "$job"
  trial=$((trial + 1))
  step=$(committed_step "$ck")
  # A step folder past the committed one, or a rank's .tmp folder: the kill cut a save short.
  newest=$(ls -d "$ck"/step-* 2> /dev/null | sed 's/.*step-0*//' | sort -n | tail -1)
  if [ "${newest:-0}" -gt "${step/none/0}" ] || compgen -G "$ck/step-*/rank-*.tmp" > /dev/null; then
    cut="cut the save of step ${newest} short"; mid_save=$((mid_save + 1))
  else
    cut="landed between saves"
  fi
  tag=resume-$$-$trial
  if train $steps --checkpoint "$ck" --resume --log "$work/resume-$trial.jsonl" > "$work/resume-$trial.txt" 2>&1; then
    resumable=$((resumable + 1))
    touch "$work/resume-$trial.jsonl"
    if [ "$step" = "$steps" ]; then
      verdict="the kill came after the last commit: nothing left to compare"
    elif losses "$work/resume-$trial.jsonl" | diff -q - <(awk -v s="$step" '$1 > s' "$work/ref.losses") > /dev/null; then
      matching=$((matching + 1)); compared=$((compared + 1)); verdict="losses match"
    else
      compared=$((compared + 1)); verdict="LOSSES DIFFER"
    fi
  else
    verdict="NOT RESUMABLE: $(grep -m1 error "$work/resume-$trial.txt")"
  fi
  echo "trial $trial: kill -9 rank $rank ${delay_ms} ms after it began a save ($cut); committed step $step; $verdict"
done
echo "$resumable of $trial left a resumable checkpoint; $matching of $compared resumed runs match the uninterrupted losses exactly" \
     "($mid_save of the kills cut a save short; $((attempts - trial)) runs ended before the kill)"
