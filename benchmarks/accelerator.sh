#!/usr/bin/env bash
# The accelerator checks in one go, under 8 minutes on one GPU (caps 130 + 80 + 190 s, plus
# start-up; a pip install of .[cuda], when jax has no GPU backend, comes on top):
#   1. the throughput benchmark (fused, grouped, one_program; no PyTorch, no scaling part),
#   2. the cost model (XLA's cost of the programs as compiled for this device),
#   3. the dry run's prediction, then `mhjax train` of configs/paper.py with 8 seeds
#      (64 members) for STEPS steps (default 2000), interrupted cleanly if over its cap.
#   bash benchmarks/accelerator.sh [OUT_DIR]        (default $OUT, else out/accelerator)
# Writes OUT_DIR/{throughput.json, cost_model.json, dry_run.txt, paper64/, stages.json, *.log}.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-out/accelerator}}
steps=${STEPS:-2000}
mkdir -p "$out"
py=${PYTHON:-python}
export XLA_PYTHON_CLIENT_PREALLOCATE=false

if ! "$py" -c 'import jax, sys; sys.exit(jax.default_backend() != "gpu")' 2>/dev/null; then
  "$py" -m pip install -q -e ".[cuda]" || echo "pip install .[cuda] failed; continuing with what jax finds"
fi
"$py" -c 'import jax; print("jax", jax.__version__, jax.devices())' | tee "$out/devices.txt"

stages=()
stage() {  # stage NAME CAP_SECONDS SIGNAL COMMAND...: run with a time cap, log, record rc and seconds
  local name=$1 cap=$2 sig=$3; shift 3
  local start=$SECONDS
  timeout -s "$sig" -k 20 "$cap" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  stages+=("\"$name\": {\"rc\": $rc, \"seconds\": $((SECONDS - start)), \"cap_s\": $cap}")
  echo "$name: rc $rc in $((SECONDS - start)) s (log $out/$name.log)"
}

stage throughput 130 TERM "$py" benchmarks/throughput.py --quick --no-scaling --no-torch \
  --strategies fused,grouped,one_program --cache-dir "" --json "$out/throughput.json"
stage cost_model 80 TERM "$py" benchmarks/cost_model.py --strategies fused,grouped,one_program --json "$out/cost_model.json"
seeds="--config.sweep.seed=0,1,2,3,4,5,6,7"
"$py" -m mhjax train --config configs/paper.py "$seeds" --dry-run > "$out/dry_run.txt" 2>&1
# SIGINT: mhjax writes a checkpoint and exits 130, so a capped run still leaves its state.
stage paper64 190 INT "$py" -m mhjax train --config configs/paper.py "$seeds" --config.train.steps="$steps" \
  --config.train.checkpoint_every="$steps" --workdir "$out/paper64" --no-progress

(IFS=,; echo "{${stages[*]}}") > "$out/stages.json"
cat "$out/stages.json"
