"""`mhjax status --workdir W` and `mhjax.load(W).status()` (io/sweep_state.py): each member's
state, step, checkpoint, rate and time to finish, read while another process holds the workdir."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import mhjax
from mhjax import cli
from mhjax.experiments import make_experiment
from mhjax.io import progress
from mhjax.io.workdir import Workdir
from mhjax.train.loop import Interrupted, Sweep, run
from tests.conftest import tiny_sequence_config, tiny_train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 6


def config():
    return tiny_train(tiny_sequence_config(heads=(1, 2)), STEPS, 3, 3, 3)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """A sweep stopped by SIGUSR1 after its first chunk (checkpoint 3 of 6)."""
    workdir = str(tmp_path_factory.mktemp("status") / "w")
    original, calls = Sweep.run_chunk, []

    def run_chunk(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:  # once: a second signal would exit at once
            signal.raise_signal(signal.SIGUSR1)  # handled at this chunk's end
        return original(self, *args, **kwargs)

    Sweep.run_chunk = run_chunk
    try:
        with pytest.raises(Interrupted):
            run(make_experiment(config()), workdir, progress=False, log=lambda m: None)
    finally:
        Sweep.run_chunk = original
    return workdir


def _rows(status):
    return {row["name"]: row for row in status["members"]}


def test_a_stopped_sweep_says_stopped_at_its_checkpoint_with_a_time_to_finish(stopped):
    status = mhjax.load(stopped).status()
    written = progress.read(Workdir(stopped))
    names = [m.name for m in make_experiment(config()).members]
    assert written["members"] == names and written["step"] == 3 and written["total_steps"] == STEPS
    assert status["holder_pid"] is None and status["total_steps"] == STEPS
    rows = _rows(status)
    assert sorted(rows) == sorted(names)
    rate = written["member_steps_per_s"]
    for row in rows.values():
        assert row["state"] == "stopped" and row["step"] == row["checkpoint_step"] == 3
        assert 0 <= row["checkpoint_age_s"] < 3600
        assert row["member_steps_per_s"] == rate > 0
        assert row["eta_s"] == pytest.approx((STEPS - 3) * len(names) / rate)


HOLDER = textwrap.dedent(
    """
    import sys, time
    from mhjax.io.lock import WorkdirLock
    with WorkdirLock(sys.argv[1], "train"):
        print("held", flush=True)
        time.sleep(600)
    """
)


def test_status_reads_a_held_workdir_training_diverged_and_missing_members(stopped, tmp_path, capsys):
    """Another process holds the lock and writes the progress (its step, rate, a diverged member,
    a member in no checkpoint yet): its members train; once it is gone, they are stopped, and the
    member no checkpoint holds is missing."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, stopped], env=env, stdout=subprocess.PIPE, text=True)
    path = progress.path_of(Workdir(stopped))
    saved = open(path).read()
    names = json.loads(saved)["members"]
    try:
        assert holder.stdout.readline().strip() == "held"
        fake = dict(json.loads(saved), pid=holder.pid, step=5, member_steps_per_s=4.0, diverged=[names[1]])
        fake["members"] = names + ["later-h8-s0"]
        with open(path, "w") as f:
            json.dump(fake, f)
        held = mhjax.load(stopped).status()
        assert cli.main(["status", "--workdir", stopped]) == 0
        out = capsys.readouterr().out
        holder.kill()
        holder.wait()
        gone = _rows(mhjax.load(stopped).status())
    finally:
        if holder.poll() is None:
            holder.kill()
        with open(path, "w") as f:
            f.write(saved)
    assert held["holder_pid"] == holder.pid and f"held by pid {holder.pid}" in out
    rows = _rows(held)
    assert rows[names[0]]["state"] == "training" and rows[names[0]]["step"] == 5
    assert rows[names[0]]["checkpoint_step"] == 3
    assert rows[names[0]]["eta_s"] == pytest.approx((STEPS - 5) * 3 / 4.0)  # 3 members of the progress at 4/s
    assert rows[names[1]]["state"] == "diverged"
    assert rows["later-h8-s0"]["state"] == "training" and rows["later-h8-s0"]["checkpoint_step"] is None
    assert "2 training, 1 diverged" in out
    assert gone[names[0]]["state"] == "stopped" and gone[names[0]]["step"] == 3
    assert gone[names[1]]["state"] == "diverged"
    assert gone["later-h8-s0"]["state"] == "missing" and gone["later-h8-s0"]["step"] is None


def test_status_of_a_folder_that_is_no_workdir_is_one_line_and_exit_2(tmp_path, capsys):
    assert cli.main(["status", "--workdir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mhjax: error: --workdir: ") and len(err.strip().splitlines()) == 1
