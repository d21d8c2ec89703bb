#!/usr/bin/env bash
# The paper's full protocol in one command, for a GPU run: train configs/paper.py with 8 seeds
# (64 members, 20,000 steps), `mhjax analyze`, `mhjax report --reference` against the released
# checkpoints, and the files docs/reproduction.md is made of. No network: mhjax runs from this
# checkout (PYTHONPATH); missing pure-Python packages come from a wheels folder.
#   bash benchmarks/reproduce_paper.sh REFERENCE_DIR [WORKDIR] [OUT_DIR] [WHEELS_DIR]
# REFERENCE_DIR: the released checkpoints {H}_heads_{task}.pt (the reference repository's
# checkpoints/ folder). WORKDIR: the sweep's workdir (default out/paper_full; an unfinished one
# resumes). OUT_DIR: what comes back (default $OUT, else out/reproduction): timings.json,
# reproduction.md, reproduction.tar.gz (report.md and its figures, results.json,
# analysis/analysis.json, mhjax.json) and the three logs. WHEELS_DIR, or WHEELS=DIR: see
# benchmarks/wheels.sh.
#
# Time on one H200 (benchmarks/RESULTS.md "Accelerator plan"): 1.28 M member-steps take 320 s at
# the kernel's target of 4,000 member-steps/s (608 s on the JAX path's measured 2,104), plus
# ~60-90 s of compiling, evaluations and checkpoints: ~7 min; under 9 min in all if analyze
# (with its head ablation: ~2.5-6 min for 64 members by this CPU's figures, unmeasured on a GPU)
# and report keep to ~2 min: ANALYZE_ARGS=--no-ablation is the lever. STEPS=N trains fewer steps
# (the protocol is 20,000).
#
# Environment: PYTHON (python3), STEPS (20000), SEEDS (0,1,...,7), ATTENTION (unset: the
# config's own, "auto"), ANALYZE_ARGS (more options for mhjax analyze, e.g. --no-ablation),
# SMOKE=1 (tiny settings, end to end on a CPU), DRY=1 (print, exit).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
reference=${1:?usage: bash benchmarks/reproduce_paper.sh REFERENCE_DIR [WORKDIR] [OUT_DIR] [WHEELS_DIR]}
workdir=${2:-out/paper_full}
out=${3:-${OUT:-out/reproduction}}
wheels=${4:-${WHEELS:-}}
py=${PYTHON:-python3}
steps=${STEPS:-20000}
seeds=${SEEDS:-0,1,2,3,4,5,6,7}
config=configs/paper.py
extra=()
[ -n "${ATTENTION:-}" ] && extra+=(--config.attention="$ATTENTION")
if [ "${SMOKE:-0}" = 1 ]; then  # the same commands on a model small enough for a CPU
  steps=${STEPS:-4} seeds=${SEEDS:-0}
  extra+=(--config.model.seq_len=8 --config.train.chunk_steps=2 --config.train.eval_every=2
    --config.train.checkpoint_every=2 --config.data.num_eval=8 --config.data.num_train=100)
fi
# shellcheck disable=SC2206  # ANALYZE_ARGS: extra words for mhjax analyze, e.g. --no-ablation
analyze_args=(${ANALYZE_ARGS:-})
[ "${SMOKE:-0}" = 1 ] && analyze_args+=(--num-sequences 4 --horizon 8 --max-steps 8)
train=("$py" -m mhjax train --config "$config" --config.sweep.seed="$seeds" --config.train.steps="$steps"
  "${extra[@]}" --workdir "$workdir" --no-progress)
if [ "${DRY:-0}" = 1 ]; then
  echo "${train[*]}"
  echo "$py -m mhjax analyze --workdir $workdir ${analyze_args[*]}"
  echo "$py -m mhjax report --workdir $workdir --reference $reference"
  exit 0
fi
[ -d "$reference" ] || { echo "REFERENCE_DIR: no such folder: $reference" >&2; exit 2; }
mkdir -p "$out" "$(dirname "$workdir")"
out=$(cd "$out" && pwd)
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
if ! "$py" -c 'import ml_collections, tensorboardX' 2>/dev/null; then
  site=$(mktemp -d "${TMPDIR:-/tmp}/mhjax-site.XXXXXX")  # not under OUT_DIR: only results come back
  [ -n "$wheels" ] || { echo "ml_collections or tensorboardX missing and no wheels folder (arg 4 or WHEELS=DIR)" >&2; exit 2; }
  "$py" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check \
    --find-links "$wheels" --target "$site" ml-collections tensorboardX || { echo "wheel install failed" >&2; exit 2; }
  export PYTHONPATH="$PYTHONPATH:$site"
fi

timed() {  # timed NAME COMMAND...: run, log to OUT/NAME.log, the seconds in $took; stop on failure
  local name=$1 start=$SECONDS
  shift
  "$@" > "$out/$name.log" 2>&1
  local rc=$?
  took=$((SECONDS - start))
  echo "$name: rc $rc in $took s (log $out/$name.log)"
  if [ $rc != 0 ]; then
    tail -20 "$out/$name.log"
    exit 1
  fi
}
started=$SECONDS
timed train "${train[@]}"
train_s=$took
timed analyze "$py" -m mhjax analyze --workdir "$workdir" "${analyze_args[@]}"
analyze_s=$took
timed report "$py" -m mhjax report --workdir "$workdir" --reference "$reference"
report_s=$took
total_s=$((SECONDS - started))

"$py" benchmarks/train_run_summary.py --workdir "$workdir" --log "$out/train.log" --json "$out/train_summary.json" \
  --wall-s "$train_s"
"$py" - "$out" "$workdir" "$reference" "$train_s" "$analyze_s" "$report_s" "$total_s" "${train[*]}" <<'EOF'
import datetime, json, os, platform, re, sys
import jax
out, workdir, reference, train_s, analyze_s, report_s, total_s, train_cmd = sys.argv[1:]
summary = json.load(open(os.path.join(out, "train_summary.json")))
os.remove(os.path.join(out, "train_summary.json"))
device = jax.devices()[0]
timings = {
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "device": f"{len(jax.devices())} x {device.device_kind} ({jax.default_backend()})",
    "jax": jax.__version__, "platform": platform.platform(),
    "train_s": int(train_s), "analyze_s": int(analyze_s), "report_s": int(report_s), "total_s": int(total_s),
    "commands": [train_cmd, f"mhjax analyze --workdir {workdir}", f"mhjax report --workdir {workdir} --reference {reference}"],
    "train": summary,
}
json.dump(timings, open(os.path.join(out, "timings.json"), "w"), indent=2)
rate = summary.get("steady_member_steps_per_s")
compile_s = summary.get("compile_s")  # train_run_summary.compile_seconds
facts = [
    f"- Date: {timings['date'][:10]}. Device: {timings['device']}, jax {timings['jax']}.",
    f"- {summary['steps_done']:,} steps x {summary['members']} members (configs/paper.py, seeds as below).",
    f"- Wall time: `mhjax train` {int(train_s)} s"
    + (f" (steady {rate:,.0f} member-steps/s; compile ~{compile_s:.0f} s)" if rate and compile_s is not None else "")
    + f", `mhjax analyze` {int(analyze_s)} s, `mhjax report` {int(report_s)} s; {int(total_s)} s in all.",
]
report = open(os.path.join(workdir, "report.md")).read()
with open(os.path.join(out, "reproduction.md"), "w") as f:
    f.write("# Reproduction of the paper's protocol (benchmarks/reproduce_paper.sh)\n\n")
    f.write("\n".join(facts) + "\n\n```bash\n" + "\n".join(timings["commands"]) + "\n```\n\n")
    f.write("<!-- W/report.md below -->\n")
    f.write(re.sub(r"\]\(report/", "](reproduction/", report))
EOF
tar -czf "$out/reproduction.tar.gz" -C "$workdir" report.md report results.json analysis/analysis.json mhjax.json
echo "wrote $out: timings.json, reproduction.md, reproduction.tar.gz; $total_s s in all"
