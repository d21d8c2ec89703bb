#!/usr/bin/env bash
# The accelerator checks in one go: at most BUDGET_S (420 s = 7 min) on one GPU or TPU VM, no network.
#   bash benchmarks/accelerator.sh [OUT_DIR] [WHEELS_DIR]
# OUT_DIR: default $OUT, else out/accelerator. WHEELS_DIR (or WHEELS=DIR): a folder of wheels for
# the pure-Python packages the device lacks (ml-collections, tensorboardX; benchmarks/wheels.sh
# builds it); they are installed with pip --no-index into a scratch folder, nothing is fetched.
# mhjax runs from this checkout (PYTHONPATH), never installed.
# On a TPU VM: `pip install -e ".[tpu,test]"` (jax[tpu] and pytest for the kernel's tests; no
# wheels folder needed), then `bash benchmarks/accelerator.sh`: the same stages, where they apply.
#
# Stages (caps from the H200 run of 2026-12 and the deviceless compiles since, see
# benchmarks/RESULTS.md "Accelerator plan" and "Accelerator plan: bfloat16, text, two devices"):
#   -  set-up       ~15 s  wheels, the devices, a text corpus written from Python's own docs
#   a. kernel_tests  60 s  the Pallas kernels' equality tests, all of them (slow ones too), real
#                          lowering (interpret mode is for CPUs only), on 4 pytest workers
#   -  dry runs      35 s  `mhjax train --dry-run` of each training stage below (the cost model's
#                          predicted rate, which each stage's JSON carries)
#   b. throughput    95 s  one_program with attention jax and pallas, both PyTorch peers (one
#                          model at a time; torch.func ensemble), 16 seeds = 64 members
#   c. paper_bf16    60 s  configs/paper.py, 8 seeds (64 members), model.dtype=bfloat16, 2,000 steps
#   d. text_bf16     60 s  configs/text.py (T = 256, heads 1-16, width 256) in bfloat16 on the
#                          corpus, 1,000 steps
#   e. shard2        60 s  only where the machine has more than one device: configs/paper.py, 8 seeds,
#                          split over 2 devices (config.devices=2), 2,000 steps; against paper64 (one)
#   f. paper64      rest   configs/paper.py with 8 seeds (64 members) on one device: as many steps as
#                          fit, stopped by SIGINT at the cap (mhjax checkpoints and exits 130)
# When time runs short, paper64 gives way: it runs last, on what the others left (at least 10 s,
# else skipped). Every earlier cap is also cut to what the budget has left, so the script ends
# within BUDGET_S. paper64 goes first because throughput measures the same 64-member one_program
# step on both paths (and the JAX path's long run was measured before: 2,104 member-steps/s).
# Every stage writes OUT_DIR/<stage>.json within its cap (a stage stopped at its cap gets one
# that says so, with its log's tail; every stage's JSON carries "backend" and "device_kind", from
# the set-up's devices.json); a training stage's JSON (train_run_summary.py) has the
# steady rate beside its dry run's prediction. If the kernel's tests fail (or there is no kernel)
# the script says so and measures the JAX path only. OUT_DIR ends with stages.json, the stages'
# JSONs and logs and the dry runs' texts (dry_run*.txt); the workdirs and scratch go to WORK.
#
# Environment: PYTHON (python3), BUDGET_S (420), STEPS (20000: the cap decides), SHORT_STEPS
# (2000: paper_bf16 and shard2), TEXT_STEPS (1000), TP_SEEDS (16), TP_STEPS (50), CAP_TESTS (60; 90 on a TPU),
# CAP_THROUGHPUT (95; 65 on a TPU), CAP_STAGE (60: each of c, d, e), WORK (a fresh temporary folder), SMOKE=1
# (tiny settings that run end to end on a CPU; XLA_FLAGS=--xla_force_host_platform_device_count=2
# gives it two devices, so shard2 runs too), DRY=1 (print the plan and exit), ACCEL_BACKEND (the
# backend the plan is for: default jax's, or gpu under DRY=1; tpu rehearses a TPU's plan anywhere),
# ACCEL_DEVICES (DRY=1 only: the device count the plan assumes, which decides shard2).
# On a TPU (the backend jax reports, or ACCEL_BACKEND=tpu) the plan differs only where a GPU's
# does not apply: a. runs tests/test_pallas_tpu_attention.py (mhjax's Mosaic kernel, compiled, not
# interpreted) in one process (libtpu lets one process hold the chips), cap 90 s; b. has no
# PyTorch peers (PyTorch has no TPU device here: they would time the VM's CPU; throughput.json
# says so under "torch_skipped"), cap 65 s; config.attention=pallas runs the Mosaic kernel there
# (each stage's JSON records the implementation resolved); e. needs more than one chip.
# On a GPU (and a CPU) a. runs the Triton kernels' tests (tests/test_pallas*.py but the TPU
# kernel's, tests/test_block_kernels.py). Either way the tests run on the device's backend
# (JAX_PLATFORMS set to it: tests/conftest.py would otherwise pin them to the CPU).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${1:-${OUT:-out/accelerator}}
wheels=${2:-${WHEELS:-}}
py=${PYTHON:-python3}
budget=${BUDGET_S:-420}
smoke=${SMOKE:-0}
started=$SECONDS

# Caps (seconds) and sizes; SMOKE shrinks the work, not the plan. The kernel tests' and
# throughput's caps depend on the backend (backend_plan, below).
cap_dry=35 cap_stage=${CAP_STAGE:-60}
setup_s=15 grace=15 reserve=15 min_paper=10
steps=${STEPS:-20000} short=${SHORT_STEPS:-2000} text_steps=${TEXT_STEPS:-1000}
seeds="0,1,2,3,4,5,6,7"
tp_args=(--quick --no-scaling --seeds "${TP_SEEDS:-16}" --steps "${TP_STEPS:-50}" --reps 2 --cache-dir "")
config=configs/paper.py
paper_extra=()
short_extra=(--config.train.checkpoint_every="$short")
text_kib=1024
text_extra=(--config.train.steps="$text_steps" --config.train.chunk_steps=100 --config.train.eval_every="$text_steps"
  --config.train.checkpoint_every="$text_steps")
if [ "$smoke" = 1 ]; then
  steps=${STEPS:-4} short=${SHORT_STEPS:-4} seeds="0"
  tp_args=(--quick --no-scaling --seeds 1 --steps 1 --reps 1 --length 16 --cache-dir "")
  config=configs/quick.py
  paper_extra=(--config.model.seq_len=8 --config.train.chunk_steps=2 --config.train.eval_every=2
    --config.data.num_eval=8 --config.data.num_train=100)
  short_extra=(--config.train.checkpoint_every="$short" --config.model.width=16 --config.model.num_layers=1
    --config.model.mlp_dim=32)
  text_kib=64
  text_extra=(--config.train.steps=4 --config.train.chunk_steps=2 --config.train.eval_every=4
    --config.train.checkpoint_every=4 --config.train.warmup_steps=1 --config.model.width=16 --config.model.num_layers=1 --config.model.mlp_dim=32
    --config.model.seq_len=16 --config.data.batch_size=4 --config.data.num_eval=8 --config.sweep.heads=1,2)
fi
backend_plan() {  # what depends on the backend ($backend): the kernel's tests, two caps, the peers
  unit=device no_torch="" test_procs=${TEST_WORKERS:-4} paths="jax and pallas"
  if [ "$backend" = tpu ]; then
    paths="jax and pallas (there: pallas_tpu, mhjax's Mosaic kernel)"
    # no PyTorch peers, so throughput needs less; the kernel's tests compile in one process
    cap_tests=${CAP_TESTS:-90} cap_throughput=${CAP_THROUGHPUT:-65} unit="TPU chip" test_procs=1
    no_torch="PyTorch has no TPU device here (no torch_xla in the plan): its peers would time the VM's CPU"
    kernel_test_files=$(ls tests/test_pallas_tpu_attention.py 2>/dev/null)
  else
    cap_tests=${CAP_TESTS:-60} cap_throughput=${CAP_THROUGHPUT:-95}
    [ "$backend" = gpu ] && unit=GPU
    # the Triton kernels' tests (the TPU kernel's would only interpret it here)
    kernel_test_files=$(ls tests/test_pallas*.py tests/test_block_kernels.py 2>/dev/null | grep -v test_pallas_tpu)
  fi
  kernel_test_files=$(echo $kernel_test_files)
}
case "${ACCEL_BACKEND:-}" in
  "" | cpu | gpu | tpu) ;;
  *) echo "ACCEL_BACKEND: must be cpu, gpu or tpu; got '$ACCEL_BACKEND'" >&2; exit 2 ;;
esac
case "${ACCEL_DEVICES:-1}" in
  "" | *[!0-9]*) echo "ACCEL_DEVICES: must be a whole number of devices; got '$ACCEL_DEVICES'" >&2; exit 2 ;;
esac
if [ "${DRY:-0}" = 1 ]; then
  backend=${ACCEL_BACKEND:-gpu} # no Python under DRY: a GPU's plan unless told
  backend_plan
  peers="both PyTorch peers"
  [ -n "$no_torch" ] && peers="PyTorch peers skipped: $no_torch"
  lowering="compiled for $backend, $test_procs process(es)"
  [ "$backend" = cpu ] && lowering="interpret mode, $test_procs process(es)"
  shard2="shard2 cap $cap_stage s, only with more than one $unit ($config seeds $seeds over 2 devices, $short steps);"
  if [ -n "${ACCEL_DEVICES:-}" ]; then
    shard2="shard2 cap $cap_stage s, $ACCEL_DEVICES ${unit}s here ($config seeds $seeds over 2 devices, $short steps);"
    [ "$ACCEL_DEVICES" -gt 1 ] || shard2="shard2: skipped, only $ACCEL_DEVICES $unit here;"
  fi
  echo "plan for a $backend backend (budget $budget s): set-up ~$setup_s s;" \
    "kernel_tests cap $cap_tests s (${kernel_test_files:-none}: $lowering); dry runs cap $cap_dry s;" \
    "throughput cap $cap_throughput s (${tp_args[*]}; attention $paths; $peers);" \
    "paper_bf16 cap $cap_stage s ($config seeds $seeds, model.dtype=bfloat16, $short steps);" \
    "text_bf16 cap $cap_stage s (configs/text.py at T = 256 in bfloat16 on $text_kib KiB of Python's docs, ${text_extra[*]});" \
    "$shard2" \
    "paper64: the rest minus $((grace + reserve)) s (gives way first when time runs short; skipped under" \
    "$min_paper s), $config seeds $seeds on one device, up to $steps steps"
  exit 0
fi

mkdir -p "$out"
out=$(cd "$out" && pwd)
work=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/mhjax-accelerator.XXXXXX")}
mkdir -p "$work"
# A fresh compile cache: compile times are measured cold, whatever ran before on this machine.
export MHJAX_CACHE_DIR="$work/cache"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false

# ---- set-up: packages from the wheels folder, never the network
if ! "$py" -c 'import ml_collections, tensorboardX' 2>/dev/null; then
  if [ -z "$wheels" ]; then
    echo "ml_collections or tensorboardX missing and no wheels folder given (arg 2 or WHEELS=DIR)" >&2
    exit 2
  fi
  "$py" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check \
    --find-links "$wheels" --target "$work/site" ml-collections tensorboardX || { echo "wheel install failed" >&2; exit 2; }
  export PYTHONPATH="$PYTHONPATH:$work/site"
fi
"$py" - > "$work/devices.json" <<'EOF'
import datetime, json, platform, jax
info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "jax": jax.__version__, "backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()],
        "device_kind": jax.devices()[0].device_kind, "platform": platform.platform()}
try:
    import torch
    info["torch"] = torch.__version__
    info["torch_cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
except ImportError:
    info["torch"] = None
print(json.dumps(info, indent=2))
EOF
cat "$work/devices.json"
read -r jax_backend devices < <("$py" -c 'import json, sys; d = json.load(open(sys.argv[1]))
print(d["backend"], len(d["devices"]))' "$work/devices.json")
backend=${ACCEL_BACKEND:-$jax_backend}
backend_plan
echo "plan for a $backend backend; jax's: $jax_backend, $devices device(s)"
# The text stage's corpus: Python's own documentation, written here (no network on the device)
"$py" examples/python_docs.py "$work/python_docs.txt" --kib "$text_kib"

stages=()
stamp() {  # stamp JSON...: the device's backend and kind into each stage's JSON (what measured it)
  "$py" benchmarks/stage_device.py "$work/devices.json" "$backend" "$@"
}
left() { echo $((budget - (SECONDS - started))); }
fit() { local room=$(($(left) - grace - reserve)); echo $(($1 < room ? $1 : room)); } # a cap within the budget
stage() {  # stage NAME CAP SIGNAL JSON COMMAND...: capped run; a JSON saying so if it wrote none
  local name=$1 cap=$2 sig=$3 json=$4
  shift 4
  local start=$SECONDS
  if [ "$cap" -lt 10 ]; then # the budget is spent (timeout 0 would mean no cap at all)
    echo "$name: skipped, only $cap s of the budget left" | tee "$out/$name.log"
    set -- false
    cap=1
  fi
  timeout -s "$sig" -k "$grace" "$cap" "$@" > "$out/$name.log" 2>&1
  local rc=$? took=$((SECONDS - start))
  stages+=("\"$name\": {\"rc\": $rc, \"seconds\": $took, \"cap_s\": $cap}")
  echo "$name: rc $rc in $took s (cap $cap s; log $out/$name.log)"
  if [ -n "$json" ] && [ ! -s "$json" ]; then
    "$py" - "$name" "$rc" "$took" "$cap" "$out/$name.log" > "$json" <<'EOF'
import json, sys
name, rc, took, cap, log = sys.argv[1:]
tail = open(log, errors="replace").read().splitlines()[-15:]
print(json.dumps({"stage": name, "completed": False, "rc": int(rc), "seconds": int(took), "cap_s": int(cap),
                  "why": "capped" if int(rc) in (124, 130, 137) else "failed", "log_tail": tail}, indent=2))
EOF
  fi
  return $rc
}

# ---- a. the kernel's equality tests on the device, real lowering (not interpret mode)
kernel_ok=0
# the kernels' tests (backend_plan): on a GPU attention and the block kernels alone and in the
# model (Triton), on a TPU the Mosaic attention kernel's
test_file=$kernel_test_files
if [ -n "$test_file" ]; then
  # The kernels interpret only on a CPU backend: on the device these tests run the real lowering.
  workers=()  # compiles are CPU-bound: spread the cases over a few processes when xdist is there
  [ "$test_procs" -gt 1 ] && "$py" -c 'import xdist' 2>/dev/null && workers=(-n "$test_procs" --dist load)
  [ ${#workers[@]} -gt 0 ] || test_procs=1
  # tests/conftest.py pins the suite to the CPU unless JAX_PLATFORMS says otherwise
  stage kernel_tests "$(fit "$cap_tests")" TERM "" env JAX_PLATFORMS="$jax_backend" "$py" -m pytest -q \
    -o addopts="" -p no:cacheprovider "${workers[@]}" $test_file --junitxml "$work/kernel_tests.xml"
  rc=$?
  "$py" - "$work/kernel_tests.xml" "$rc" "$test_file" "$test_procs" > "$out/kernel_tests.json" <<'EOF'
import json, sys, xml.etree.ElementTree as ET
path, rc, test_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
out = {"stage": "kernel_tests", "file": test_file, "rc": rc, "processes": int(sys.argv[4])}
try:
    cases = list(ET.parse(path).getroot().iter("testcase"))
    bad = lambda c: c.find("failure") is not None or c.find("error") is not None
    out.update(tests=len(cases), failed=[f"{c.get('classname')}::{c.get('name')}" for c in cases if bad(c)],
               skipped=sum(c.find("skipped") is not None for c in cases))
except (OSError, ET.ParseError) as exc:
    out.update(tests=0, failed=[], note=f"no junit report ({exc}); capped or crashed")
out["passed"] = rc == 0 and out["tests"] > out.get("skipped", 0)
print(json.dumps(out, indent=2))
EOF
  "$py" -c 'import json, sys; sys.exit(0 if json.load(open(sys.argv[1]))["passed"] else 1)' "$out/kernel_tests.json" \
    && kernel_ok=1
else
  echo '{"stage": "kernel_tests", "passed": false, "note": "no kernel tests for this backend in this checkout"}' \
    > "$out/kernel_tests.json"
fi
stamp "$out/kernel_tests.json"
if [ "$kernel_ok" = 1 ]; then
  attention=pallas
  echo "kernel: its tests pass on this device; measuring the jax and pallas paths"
else
  attention=jax
  echo "KERNEL NOT USED: its tests did not pass here (see $out/kernel_tests.json); measuring the JAX path only"
fi

# ---- the dry run's prediction. The attention implementation is set by a config that adds
# config.attention to the chosen one; a checkout without that field (older) is told through
# its MHJAX_ATTENTION variable instead.
run_config="$work/config.py"
cat > "$run_config" <<EOF
import importlib.util

spec = importlib.util.spec_from_file_location("base_config", "$root/$config")
base = importlib.util.module_from_spec(spec)
spec.loader.exec_module(base)


def get_config():
    config = base.get_config()
    config.attention = "$attention"
    return config
EOF
dry_end=$((SECONDS + cap_dry))
dry_cap() { local room=$((dry_end - SECONDS)); echo $((room > 1 ? room : 1)); }
dry() { timeout -k 5 "$(dry_cap)" "$py" -m mhjax train --config "$1" --config.sweep.seed="$seeds" \
  --config.train.steps="$steps" --config.devices=1 "${paper_extra[@]}" --dry-run; }
if ! dry "$run_config" > "$out/dry_run.txt" 2>&1 && grep -q "config.attention: unknown field" "$out/dry_run.txt"; then
  echo "this checkout has no config.attention: MHJAX_ATTENTION=$attention" | tee -a "$out/dry_run.txt"
  run_config=$config
  export MHJAX_ATTENTION=$attention
  dry "$run_config" >> "$out/dry_run.txt" 2>&1
fi
cat "$out/dry_run.txt"
# The new stages' configs: the same sweep in bfloat16, the text sweep, the sweep over 2 GPUs
bf16_args=(--config "$run_config" --config.sweep.seed="$seeds" --config.train.steps="$short" --config.devices=1
  --config.model.dtype=bfloat16 "${paper_extra[@]}" "${short_extra[@]}")
text_args=(--config configs/text.py --config.data.path="$work/python_docs.txt" --config.attention="$attention"
  --config.model.dtype=bfloat16 --config.devices=1 "${text_extra[@]}")
shard2_args=(--config "$run_config" --config.sweep.seed="$seeds" --config.train.steps="$short" --config.devices=2
  "${paper_extra[@]}" "${short_extra[@]}")
timeout -k 5 "$(dry_cap)" "$py" -m mhjax train "${bf16_args[@]}" --dry-run > "$out/dry_run_bf16.txt" 2>&1
timeout -k 5 "$(dry_cap)" "$py" -m mhjax train "${text_args[@]}" --dry-run > "$out/dry_run_text.txt" 2>&1
[ "$devices" -gt 1 ] && timeout -k 5 "$(dry_cap)" "$py" -m mhjax train "${shard2_args[@]}" --dry-run \
  > "$out/dry_run_shard2.txt" 2>&1
grep -h "estimate\|prediction\|  in \|  over " "$out"/dry_run_*.txt

# ---- b. throughput: one_program on each attention path, both PyTorch peers (none on a TPU)
strategies="one_program:jax"
[ "$kernel_ok" = 1 ] && strategies="one_program:jax,one_program:pallas"
peer_args=()
[ -n "$no_torch" ] && peer_args=(--no-torch "$no_torch")
stage throughput "$(fit "$cap_throughput")" TERM "$out/throughput.json" "$py" benchmarks/throughput.py "${tp_args[@]}" \
  --strategies "$strategies" "${peer_args[@]}" --json "$out/throughput.json"
stamp "$out/throughput.json"

# ---- c, d, e: a fixed number of steps each (SIGINT at the cap), summarised beside its dry run
train_stage() {  # train_stage NAME DRY_RUN_TEXT ARGS...
  local name=$1 dry_text=$2
  shift 2
  local start=$SECONDS
  stage "$name" "$(fit "$cap_stage")" INT "" "$py" -m mhjax train "$@" --workdir "$work/$name" --no-progress
  "$py" benchmarks/train_run_summary.py --workdir "$work/$name" --log "$out/$name.log" \
    --dry-run "$dry_text" --wall-s $((SECONDS - start)) --json "$out/$name.json"
  stamp "$out/$name.json"
}
train_stage paper_bf16 "$out/dry_run_bf16.txt" "${bf16_args[@]}"
train_stage text_bf16 "$out/dry_run_text.txt" "${text_args[@]}"
if [ "$devices" -gt 1 ]; then
  train_stage shard2 "$out/dry_run_shard2.txt" "${shard2_args[@]}"
else
  echo "shard2: skipped, $devices device(s) here"
fi

# ---- f. the 64-member paper sweep on one device for whatever time is left (it gives way first)
cap=$(($(left) - grace - reserve))
[ "$cap" -lt "$min_paper" ] && cap=0 # stage() skips it and says so
start=$SECONDS
stage paper64 "$cap" INT "" "$py" -m mhjax train --config "$run_config" --config.sweep.seed="$seeds" \
  --config.train.steps="$steps" --config.train.checkpoint_every="$steps" --config.devices=1 "${paper_extra[@]}" \
  --workdir "$work/paper64" --no-progress
"$py" benchmarks/train_run_summary.py --workdir "$work/paper64" --log "$out/paper64.log" \
  --dry-run "$out/dry_run.txt" --wall-s $((SECONDS - start)) --json "$out/paper64.json"
stamp "$out/paper64.json"

(IFS=,; echo "{${stages[*]}}") > "$work/stages.json"
"$py" - "$work" "$out" "$attention" $((SECONDS - started)) "$budget" "$backend" <<'EOF'
import json, os, sys
work, out, attention, total, budget, plan_backend = sys.argv[1:]
device = json.load(open(os.path.join(work, "devices.json")))
payload = {"stages": json.load(open(os.path.join(work, "stages.json"))), "attention": attention,
           "total_s": int(total), "budget_s": int(budget), "work": work, "device": device,
           "backend": device["backend"], "device_kind": device["device_kind"], "plan_backend": plan_backend}
# measured against predicted, per training stage; shard2 against paper64 (one device)
read = lambda name: json.load(open(os.path.join(out, f"{name}.json"))) if os.path.isfile(
    os.path.join(out, f"{name}.json")) else {}
for name in ("paper64", "paper_bf16", "text_bf16", "shard2"):
    s = read(name)
    rate, predicted = s.get("steady_member_steps_per_s"), s.get("predicted", {}).get("member_steps_per_s")
    if rate or predicted:
        payload.setdefault("measured_vs_predicted", {})[name] = {
            "measured": rate, "predicted": predicted, "ratio": rate / predicted if rate and predicted else None}
one, two = read("paper64").get("steady_member_steps_per_s"), read("shard2").get("steady_member_steps_per_s")
if one and two:
    payload["shard2_over_one_device"] = two / one
json.dump(payload, open(os.path.join(out, "stages.json"), "w"), indent=2)
print(json.dumps(payload, indent=2))
EOF
