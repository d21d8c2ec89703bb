"""The device scripts (benchmarks/accelerator.sh, reproduce_paper.sh, wheels.sh): they parse,
their plans keep to the budget the issue sets, and the summary they write of a training run
reads the run's own TensorBoard rates. (Their end-to-end CPU runs, SMOKE=1, take minutes:
benchmarks/RESULTS.md "Accelerator plan" says how they were checked.) benchmarks/README.md
indexes every script there is."""

import glob
import json
import os
import re
import subprocess
import sys

import pytest

from mhjax import cli
from tests.errors_common import write_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = ["benchmarks/accelerator.sh", "benchmarks/reproduce_paper.sh", "benchmarks/wheels.sh"]
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))


def run(cmd, **env):
    return subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_parses(script):
    result = run(["bash", "-n", script])
    assert result.returncode == 0, result.stderr


def accelerator_plan(**env):
    """The DRY=1 plan's text and its caps {stage: seconds}, after checking they fit 420 s with the
    set-up, the graces and reserve (paper64 gets what is left and is named to give way)."""
    result = run(["bash", "benchmarks/accelerator.sh", "/tmp/unused"], DRY="1", **env)
    assert result.returncode == 0, result.stderr
    plan = result.stdout
    assert "budget 420 s" in plan
    setup = int(re.search(r"set-up ~(\d+) s", plan).group(1))
    caps = dict((name, int(cap)) for name, cap in re.findall(r"(\w+) cap (\d+) s", plan))
    margin = int(re.search(r"paper64: the rest minus (\d+) s \(gives way first when time runs short", plan).group(1))
    assert setup + sum(caps.values()) + margin <= 420
    return plan, caps


def test_accelerator_plan_fits_seven_minutes():
    """The set-up, the fixed caps (kernel tests, dry runs, throughput, paper_bf16, text_bf16 and,
    with more than one GPU, shard2) and the graces and reserve fit in the 420 s budget; paper64
    gets what is left and is the stage named to give way."""
    plan, caps = accelerator_plan()
    assert list(caps) == ["kernel_tests", "runs", "throughput", "paper_bf16", "text_bf16", "shard2"]
    assert "configs/paper.py seeds 0,1,2,3,4,5,6,7, model.dtype=bfloat16" in plan
    assert "configs/text.py at T = 256 in bfloat16 on 1024 KiB of Python's docs" in plan
    assert "shard2 cap 60 s, only with more than one GPU (configs/paper.py seeds 0,1,2,3,4,5,6,7 over 2 devices" in plan
    assert "configs/paper.py seeds 0,1,2,3,4,5,6,7 on one device" in plan
    # a GPU's: the Triton kernels' tests on 4 workers (not the TPU kernel's), both PyTorch peers
    assert "plan for a gpu backend" in plan and "both PyTorch peers" in plan
    tests = re.search(r"kernel_tests cap 60 s \(([^:]*): compiled for gpu, 4 process", plan).group(1).split()
    assert "tests/test_pallas_attention.py" in tests and "tests/test_pallas_tpu_attention.py" not in tests


def test_accelerator_plan_on_a_tpu():
    """ACCEL_BACKEND=tpu: the same stages within the budget; the kernel's tests are the Mosaic
    kernel's, compiled, in one process; no PyTorch peers, with the reason; shard2 only where
    there is more than one chip. A backend or device count it cannot plan for: one line, status 2."""
    plan, caps = accelerator_plan(ACCEL_BACKEND="tpu")
    assert plan.startswith("plan for a tpu backend")
    assert list(caps) == ["kernel_tests", "runs", "throughput", "paper_bf16", "text_bf16", "shard2"]
    assert "kernel_tests cap 90 s (tests/test_pallas_tpu_attention.py: compiled for tpu, 1 process(es))" in plan
    assert "attention jax and pallas (there: pallas_tpu, mhjax's Mosaic kernel)" in plan
    assert "PyTorch peers skipped: PyTorch has no TPU device here" in plan and "both PyTorch peers" not in plan
    assert "shard2 cap 60 s, only with more than one TPU chip" in plan
    one, one_caps = accelerator_plan(ACCEL_BACKEND="tpu", ACCEL_DEVICES="1")
    assert "shard2" not in one_caps and "shard2: skipped, only 1 TPU chip here" in one
    eight, eight_caps = accelerator_plan(ACCEL_BACKEND="tpu", ACCEL_DEVICES="8")
    assert eight_caps["shard2"] == 60 and "8 TPU chips here (configs/paper.py seeds 0,1,2,3,4,5,6,7 over 2" in eight
    for field, value in [("ACCEL_BACKEND", "xpu"), ("ACCEL_DEVICES", "two")]:
        bad = run(["bash", "benchmarks/accelerator.sh", "/tmp/unused"], DRY="1", **{field: value})
        assert bad.returncode == 2 and bad.stderr.startswith(f"{field}: must be") and len(bad.stderr.splitlines()) == 1


def test_every_stage_json_is_stamped_with_the_device(tmp_path):
    """stage_device.py: backend and device_kind from devices.json into a stage's JSON, keeping
    what it holds; plan_backend only where the plan was another backend's; a JSON cut short by a
    cap is left as it is."""
    from stage_device import main

    devices = tmp_path / "devices.json"
    devices.write_text(json.dumps({"backend": "tpu", "device_kind": "TPU v5 lite", "devices": ["a", "b"]}))
    stage, cut = tmp_path / "paper64.json", tmp_path / "throughput.json"
    stage.write_text(json.dumps({"steps_done": 40, "backend": "stale"}))
    cut.write_text('{"completed": fal')
    assert main([str(devices), "tpu", str(stage), str(cut), str(tmp_path / "never.json")]) == 0
    assert json.loads(stage.read_text()) == {"steps_done": 40, "backend": "tpu", "device_kind": "TPU v5 lite"}
    assert cut.read_text() == '{"completed": fal' and not (tmp_path / "never.json").exists()
    main([str(devices), "gpu", str(stage)])  # a GPU's plan rehearsed on this TPU
    assert json.loads(stage.read_text())["plan_backend"] == "gpu"


def test_throughput_takes_the_reason_the_peers_are_skipped():
    from throughput import arguments

    assert arguments([]).no_torch is None  # the peers run
    assert arguments(["--no-torch"]).no_torch == "asked (--no-torch)"
    assert arguments(["--no-torch", "no TPU in PyTorch", "--quick"]).no_torch == "no TPU in PyTorch"


def test_reproduce_paper_runs_the_full_protocol_with_a_steps_override():
    ref = "/some/checkpoints"
    full = run(["bash", "benchmarks/reproduce_paper.sh", ref], DRY="1", STEPS="").stdout.splitlines()
    assert "--config configs/paper.py --config.sweep.seed=0,1,2,3,4,5,6,7 --config.train.steps=20000" in full[0]
    assert full[1].endswith("mhjax analyze --workdir out/paper_full ")
    assert full[2].endswith(f"mhjax report --workdir out/paper_full --reference {ref}")
    fewer = run(["bash", "benchmarks/reproduce_paper.sh", ref, "W"], DRY="1", STEPS="500").stdout
    assert "--config.train.steps=500" in fewer and "--workdir W" in fewer
    missing = run(["bash", "benchmarks/reproduce_paper.sh"])
    assert missing.returncode != 0 and "REFERENCE_DIR" in missing.stderr


def test_train_run_summary_reads_the_runs_rates(tmp_path):
    """Two chunks of a tiny run: the first chunk's time includes the compile, the steady rate is
    the second chunk's, and the compile estimate is what the first chunk took beyond it."""
    from train_run_summary import summarise

    from mhjax.io.curves import read_run

    config = write_config(tmp_path / "tiny.py", "c.train.steps = 4")
    workdir = str(tmp_path / "w")
    assert cli.main(["train", "--config", config, "--workdir", workdir, "--no-progress"]) == 0
    dry_run = "strategy: grouped\npredicted for grouped on 1 x NVIDIA H200 SXM (roofline): 2,129 member-steps/s, 2 GB"
    out = summarise(workdir, log_text="compiled in 1.5 s\nother line", dry_run_text=dry_run, wall_s=9.0)
    steps, rates = read_run(os.path.join(workdir, "tb", "copy-h2-s0"))["perf/member_steps_per_s"]
    assert list(steps) == [2, 4] and out["steps_done"] == 4 and out["members"] == 1
    assert out["first_chunk_s"] == pytest.approx(2 / rates[0])
    assert out["steady_member_steps_per_s"] == pytest.approx(rates[1])
    assert out["compile_s_estimate"] == pytest.approx(2 / rates[0] - 2 / rates[1])
    assert out["compile_log_lines"] == ["compiled in 1.5 s"] and out["compile_s_logged"] == [1.5]
    assert out["predicted"]["member_steps_per_s"] == 2129 and out["wall_s"] == 9.0
    assert summarise(str(tmp_path / "never"))["steps_done"] == 0


def test_the_index_names_every_script_and_each_study_says_where_its_numbers_are():
    """benchmarks/README.md names every script in benchmarks/ and benchmarks/studies/ and no other;
    each study is named in RESULTS.md or a docs page (where its numbers are), and every data file
    there is named in RESULTS.md."""

    def text(path):
        with open(os.path.join(ROOT, path)) as f:
            return f.read()

    def files(*patterns):
        return {os.path.relpath(p, ROOT) for pattern in patterns for p in glob.glob(os.path.join(ROOT, pattern))}

    scripts = files("benchmarks/*.py", "benchmarks/*.sh", "benchmarks/studies/*.py", "benchmarks/studies/*.sh")
    assert set(re.findall(r"benchmarks/(?:studies/)?\w+\.(?:py|sh)", text("benchmarks/README.md"))) == scripts
    results = text("benchmarks/RESULTS.md")
    docs = results + "".join(text(p) for p in files("docs/*.md"))
    studies = {p for p in scripts if p.startswith("benchmarks/studies/")}
    assert studies and all(p in docs for p in studies), sorted(p for p in studies if p not in docs)
    data = files("benchmarks/*.json", "benchmarks/studies/*.json")
    assert data and all(p in results for p in data), sorted(p for p in data if p not in results)
