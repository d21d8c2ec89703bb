"""The launch files come back: launch/slurm.sbatch and launch/slurm_array.sbatch run under shims
for srun and scontrol (small scripts on PATH that record their calls), with SLURM's variables set;
SIGTERM reaches the batch shell and the step mid-run (as SLURM sends it at the time limit or on a
preemption, tests/signal_driver.py's MHJAX_TEST_ALSO), the script requeues on mhjax's 75, and the
requeued run ends as the straight run. launch/k8s_indexed_job.yaml is read as YAML and checked."""

import os
import socket
import subprocess
import sys

import pytest

from mhjax import cli
from mhjax.train.interrupt import EXIT_REQUEUE
from tests.conftest import ROOT, config_source, tiny_sequence_config, tiny_train
from tests.test_chaos import _results  # results.json less the measured times

STEPS = 9  # chunks of 3, a checkpoint every 3: the signal at the 2nd chunk stops at step 6
CONFIG = tiny_train(tiny_sequence_config(heads=(1, 2)), STEPS, 3, 3, 3)  # two programs (grouped): two whole shards

SRUN = """#!/bin/sh
echo "srun $*" >> "$SHIM_LOG"
while [ "${1#--}" != "$1" ]; do shift; done  # srun's own options
MHJAX_TEST_ALSO=$PPID exec "$@"  # the batch shell, signalled with the step (when a signal is asked for)
"""
SCONTROL = """#!/bin/sh
echo "scontrol $*" >> "$SHIM_LOG"
"""
MHJAX = f"""#!/bin/sh
if [ -n "${{FAKE_STEP:-}}" ]; then  # no training: SIGTERM to the batch shell, then exit 75 as mhjax would
  kill -TERM "$MHJAX_TEST_ALSO"; sleep 0.5; exit 75
fi
if [ -n "${{MHJAX_TEST_SIGNAL:-}}" ]; then exec {sys.executable} {ROOT}/tests/signal_driver.py "$@"; fi
exec {sys.executable} -m mhjax "$@"
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A folder to submit from: .venv/bin/activate puts the shims first on PATH; the config file."""
    root = tmp_path_factory.mktemp("launch")
    shims = root / "shims"
    shims.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL), ("mhjax", MHJAX)):
        (shims / name).write_text(text)
        (shims / name).chmod(0o755)
    (root / ".venv" / "bin").mkdir(parents=True)
    (root / ".venv" / "bin" / "activate").write_text(f'export PATH="{shims}:$PATH"\n')
    (root / "tiny.py").write_text(config_source(CONFIG))
    return root


def _job_id() -> int:
    """A job id whose jax.distributed port (SLURM's cluster detection: 61440 + id % 4096) is free."""
    for job in range(os.getpid() % 4096, os.getpid() % 4096 + 4096):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", 61440 + job % 4096))
            except OSError:
                continue
        return 4096 + job % 4096
    raise AssertionError("no free port in 61440-65535")


def sbatch(cluster, script, args, slurm: dict, signal_at: str | None = None, fake_step=False):
    """bash SCRIPT ARGS in ``cluster`` as SLURM runs a batch script: its exit status, output and
    the shims' calls. ``signal_at``: SIGTERM to the batch shell and the step at that moment."""
    log = cluster / "calls.log"
    log.write_text("")
    env = dict(os.environ, PYTHONPATH=ROOT, SHIM_LOG=str(log), JAX_PLATFORMS="cpu", **slurm)
    env.pop("MHJAX_TEST_SIGNAL", None)
    if fake_step:
        env["FAKE_STEP"] = "1"
    if signal_at:
        env.update(MHJAX_TEST_SIGNAL="SIGTERM", MHJAX_TEST_AT=signal_at)
    proc = subprocess.run(
        ["bash", os.path.join(ROOT, "launch", script), *args],
        cwd=cluster,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc.returncode, proc.stdout + proc.stderr, log.read_text().splitlines()


def _straight(cluster, name, *overrides) -> str:
    workdir = cluster / name
    args = ["train", "--config", str(cluster / "tiny.py"), "--workdir", str(workdir), "--no-progress", *overrides]
    assert cli.main(args) == 0
    return str(workdir)


# ~20 s (two runs of the real command, jax.distributed with one process): the fast form is below
@pytest.mark.slow
def test_slurm_sbatch_requeues_on_sigterm_at_the_time_limit_and_the_requeued_job_is_the_straight_run(cluster):
    job = _job_id()
    slurm = dict(
        SLURM_JOB_ID=str(job), SLURM_STEP_NODELIST="localhost", SLURM_NTASKS="1", SLURM_PROCID="0", SLURM_LOCALID="0"
    )
    args = [str(cluster / "tiny.py"), str(cluster / "w")]
    code, out, calls = sbatch(cluster, "slurm.sbatch", args, slurm, signal_at="chunk:2")
    assert code == EXIT_REQUEUE, out[-3000:]
    assert "SIGTERM: stopped at step 6, checkpoint written" in out, out[-3000:]
    assert "(SIGTERM here); requeueing job" in out
    assert calls[0].startswith("srun --kill-on-bad-exit=0 mhjax train ") and calls[1:] == [f"scontrol requeue {job}"]
    code, out, calls = sbatch(cluster, "slurm.sbatch", args, slurm)  # the requeued job: the same command
    assert code == 0 and "resuming from checkpoint at step 6" in out, out[-3000:]
    assert [c.split()[0] for c in calls] == ["srun"]  # finished: no requeue
    assert _results(cluster / "w") == _results(_straight(cluster, "straight-fused", "--config.strategy=fused"))


# ~20 s (three runs of the real command): the fast form is below
@pytest.mark.slow
def test_slurm_array_requeues_its_task_and_a_rerun_task_trains_its_own_shard(cluster):
    array = dict(SLURM_ARRAY_JOB_ID="999", SLURM_ARRAY_TASK_MIN="0", SLURM_ARRAY_TASK_MAX="1")
    args = [str(cluster / "tiny.py"), str(cluster / "shards")]
    task0 = dict(array, SLURM_ARRAY_TASK_ID="0", SLURM_ARRAY_TASK_COUNT="2")
    code, out, calls = sbatch(cluster, "slurm_array.sbatch", args, task0, signal_at="chunk:2")
    assert code == EXIT_REQUEUE and "SIGTERM: stopped at step 6, checkpoint written" in out, out[-3000:]
    assert calls == [f"srun mhjax train --config {args[0]} --workdir {args[1]} --shard 0/2 --no-progress"] + [
        "scontrol requeue 999_0"
    ]
    # The requeued task 0, then task 1 rerun alone (sbatch --array=1 ...): N comes from the workdir.
    assert sbatch(cluster, "slurm_array.sbatch", args, task0)[0] == 0
    rerun = dict(array, SLURM_ARRAY_TASK_ID="1", SLURM_ARRAY_TASK_MIN="1", SLURM_ARRAY_TASK_COUNT="1")
    code, out, calls = sbatch(cluster, "slurm_array.sbatch", args, rerun)
    assert code == 0 and calls == [f"srun mhjax train --config {args[0]} --workdir {args[1]} --shard 1/2 --no-progress"]
    assert _results(cluster / "shards") == _results(_straight(cluster, "straight"))


def test_slurm_array_on_a_new_workdir_needs_the_whole_array_or_shards_n(cluster):
    rerun = dict(
        SLURM_ARRAY_JOB_ID="7", SLURM_ARRAY_TASK_ID="1", SLURM_ARRAY_TASK_MIN="1", SLURM_ARRAY_TASK_MAX="1"
    ) | {"SLURM_ARRAY_TASK_COUNT": "1"}
    code, out, calls = sbatch(cluster, "slurm_array.sbatch", [str(cluster / "tiny.py"), str(cluster / "new")], rerun)
    assert code == 2 and calls == [] and not (cluster / "new").exists()
    assert out.strip().splitlines() == [
        f"slurm_array.sbatch: {cluster / 'new'} records no shards yet and --array is not 0-(N-1): pass --shards N"
    ]
    # --shards N: the given N (mhjax itself refuses an N that does not fit the sweep)
    args = ["--shards", "3", str(cluster / "tiny.py"), str(cluster / "new")]
    calls = sbatch(cluster, "slurm_array.sbatch", args, rerun, fake_step=True)[2]
    assert calls[0].endswith("--shard 1/3 --no-progress")


def test_k8s_indexed_job_counts_failures_per_index_passes_the_grace_and_forwards_signals():
    import yaml

    with open(os.path.join(ROOT, "launch", "k8s_indexed_job.yaml")) as f:
        job = yaml.safe_load(f)
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
    assert "backoffLimit" not in spec and spec["backoffLimitPerIndex"] >= 1  # one crashing shard stops only itself
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    command = " ".join(container["command"] + container["args"])
    grace = pod["terminationGracePeriodSeconds"]
    assert f"--config.train.preempt_grace_s={grace}" in command
    assert f'--shard "$JOB_COMPLETION_INDEX/{spec["completions"]}"' in command
    # mhjax is not PID 1 (which gets no default signal handling): an init forwards SIGTERM to it
    assert container["command"][:2] == ["tini", "--"] or pod.get("shareProcessNamespace") is True
    rules = spec["podFailurePolicy"]["rules"]
    assert {"action": "Ignore", "onExitCodes": {"containerName": "mhjax", "operator": "In", "values": [75]}} in rules
    assert any(r["action"] == "Ignore" and r.get("onPodConditions") == [{"type": "DisruptionTarget"}] for r in rules)


SLURM = dict(
    SLURM_JOB_ID="4242", SLURM_STEP_NODELIST="localhost", SLURM_NTASKS="1", SLURM_PROCID="0", SLURM_LOCALID="0"
)
ARRAY = dict(SLURM_ARRAY_JOB_ID="999", SLURM_ARRAY_TASK_MIN="0", SLURM_ARRAY_TASK_MAX="1", SLURM_ARRAY_TASK_COUNT="2")


@pytest.mark.parametrize(
    "script, slurm, requeue",
    [("slurm.sbatch", SLURM, "4242"), ("slurm_array.sbatch", dict(ARRAY, SLURM_ARRAY_TASK_ID="1"), "999_1")],
)
def test_sigterm_to_the_batch_shell_waits_for_the_step_and_requeues_on_75(cluster, script, slurm, requeue):
    """The fast form of the two tests above: a step that sends SIGTERM to the batch shell and
    exits 75 half a second later (no training). Before the trap, bash died of the SIGTERM (143)."""
    code, out, calls = sbatch(cluster, script, [str(cluster / "tiny.py"), str(cluster / "fake")], slurm, fake_step=True)
    assert code == EXIT_REQUEUE, out
    assert calls[0].startswith("srun ") and calls[1:] == [f"scontrol requeue {requeue}"]
    assert "(SIGTERM here); requeueing" in out
