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


# ---------------------------------------------------------------------------------------------- #
# A sweep in shards (--shard I/N): each shard's lock and progress, shards not started
# ---------------------------------------------------------------------------------------------- #
def shard_config():
    return tiny_train(tiny_sequence_config(heads=(1, 2, 4)), STEPS, 3, 3, 3)  # 3 programs: one per shard


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """3 shards of 6 steps: 0/3 trained to the end, 1/3 stopped by SIGUSR1 at checkpoint 3, 2/3 not started."""
    from mhjax.workflows import shards

    workdir = str(tmp_path_factory.mktemp("status-shards") / "w")
    shards.train_shard(make_experiment(shard_config()), workdir, 0, 3, progress=False, log=lambda m: None)
    original, calls = Sweep.run_chunk, []

    def run_chunk(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            signal.raise_signal(signal.SIGUSR1)
        return original(self, *args, **kwargs)

    Sweep.run_chunk = run_chunk
    try:
        with pytest.raises(Interrupted):
            shards.train_shard(make_experiment(shard_config()), workdir, 1, 3, progress=False, log=lambda m: None)
    finally:
        Sweep.run_chunk = original
    history = Workdir(workdir).metadata()["sweep_history"]
    return workdir, [list(entry["members"]) for entry in history]


def test_status_of_shards_says_done_stopped_and_not_started_per_shard_and_member(sharded):
    workdir, members = sharded
    status = mhjax.load(workdir).status()
    shards = {s["shard"]: s for s in status["shards"]}
    assert sorted(shards) == ["0/3", "1/3", "2/3"] and [len(m) for m in members] == [1, 1, 1]
    assert [shards[f"{i}/3"]["members"] for i in range(3)] == members
    assert (shards["0/3"]["state"], shards["0/3"]["step"], shards["0/3"]["eta_s"]) == ("done", STEPS, 0.0)
    assert (shards["1/3"]["state"], shards["1/3"]["step"]) == ("stopped", 3)
    assert (shards["2/3"]["state"], shards["2/3"]["step"]) == ("missing", None)
    assert all(s["holder_pid"] is None for s in shards.values())
    rows = _rows(status)
    assert sorted(rows) == sorted(sum(members, []))  # the shard not started: its members from mhjax.json
    (done,), (stopped,), (missing,) = members
    assert rows[done]["state"] == "done" and rows[done]["step"] == STEPS
    assert rows[stopped]["state"] == "stopped" and rows[stopped]["step"] == rows[stopped]["checkpoint_step"] == 3
    assert rows[stopped]["part"] == "shards/1"
    assert rows[missing]["state"] == "missing" and rows[missing]["step"] is None and rows[missing]["part"] == "shards/2"


SHARD_HOLDER = textwrap.dedent(
    """
    import sys, time
    from mhjax.io.lock import WorkdirLock
    from mhjax.io.workdir import Workdir
    with WorkdirLock(sys.argv[1], "train --shard 1/3", path=Workdir(sys.argv[1]).shard_lock_path(1)):
        print("held", flush=True)
        time.sleep(600)
    """
)


def test_status_names_the_process_holding_a_shards_lock_and_its_step(sharded, capsys):
    """Another process holds shard 1's lock (the workdir's own lock is free, as while shards train)
    and writes its progress: shard 1 and its member train at its step; the others are as they were."""
    workdir, members = sharded
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    holder = subprocess.Popen([sys.executable, "-c", SHARD_HOLDER, workdir], env=env, stdout=subprocess.PIPE, text=True)
    view = Workdir(workdir).part("shards/1", [])
    path = progress.path_of(view)
    saved = open(path).read()
    try:
        assert holder.stdout.readline().strip() == "held"
        with open(path, "w") as f:
            json.dump(dict(json.loads(saved), pid=holder.pid, step=5, member_steps_per_s=2.0), f)
        status = mhjax.load(workdir).status()
        assert cli.main(["status", "--workdir", workdir]) == 0
        out = capsys.readouterr().out
    finally:
        holder.kill()
        holder.wait()
        with open(path, "w") as f:
            f.write(saved)
    shards = {s["shard"]: s for s in status["shards"]}
    assert status["holder_pid"] is None and "3 shards, each held by the process that trains it (below)" in out
    assert (shards["1/3"]["state"], shards["1/3"]["step"], shards["1/3"]["holder_pid"]) == ("training", 5, holder.pid)
    assert shards["1/3"]["eta_s"] == pytest.approx((STEPS - 5) * 1 / 2.0)
    assert [shards[f"{i}/3"]["state"] for i in (0, 2)] == ["done", "missing"]
    row = _rows(status)[members[1][0]]
    assert (row["state"], row["step"], row["checkpoint_step"]) == ("training", 5, 3)
    assert f"1/3    training  5     pid {holder.pid}" in out
    assert "1 done, 1 training, 1 missing" in out


# A run that holds the workdir (or a shard's lock) and has only written its start: restoring and compiling
STARTING_HOLDER = textwrap.dedent(
    """
    import json, sys
    from mhjax.io.lock import WorkdirLock
    from mhjax.io.progress import Progress, read
    from mhjax.io.workdir import Workdir
    workdir, folder, shard = sys.argv[1], sys.argv[2], sys.argv[3]
    wd = Workdir(workdir)
    view = wd.part(folder, []) if folder else wd
    lock = wd.shard_lock_path(int(shard)) if shard else None
    with WorkdirLock(workdir, "train", path=lock):
        before = read(view)
        Progress(view, before["members"], before["total_steps"], before["step"]).starting()
        print("starting", flush=True)
        sys.stdin.read()  # until the test is done
    """
)


def _while_starting(workdir: str, folder: str = "", shard: str = ""):
    """(status dict, status text) while another process holds the lock and is starting; the
    progress file as it was afterwards."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    wd = Workdir(workdir)
    path = progress.path_of(wd.part(folder, []) if folder else wd)
    saved = open(path).read()
    holder = subprocess.Popen(
        [sys.executable, "-c", STARTING_HOLDER, workdir, folder, shard],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "starting"
        status = mhjax.load(workdir).status()
        out = subprocess.run(
            [sys.executable, "-m", "mhjax", "status", "--workdir", workdir], env=env, capture_output=True, text=True
        ).stdout
    finally:
        holder.kill()
        holder.wait()
        with open(path, "w") as f:
            f.write(saved)
    return holder.pid, status, out


def test_a_held_workdir_with_no_chunk_since_its_start_is_starting_not_stopped(stopped):
    pid, status, out = _while_starting(stopped)
    rows = _rows(status)
    assert {row["state"] for row in rows.values()} == {"starting"}
    assert all(row["step"] == row["checkpoint_step"] == 3 and row["eta_s"] is None for row in rows.values())
    assert f"held by pid {pid}: starting (restoring/compiling), no chunk trained since it started" in out
    assert f"{len(rows)} starting" in out


def test_a_shard_restoring_or_compiling_is_starting_with_its_checkpoint_step(sharded):
    workdir, members = sharded
    pid, status, out = _while_starting(workdir, "shards/1", "1")
    shards = {s["shard"]: s for s in status["shards"]}
    assert (shards["1/3"]["state"], shards["1/3"]["step"], shards["1/3"]["holder_pid"]) == ("starting", 3, pid)
    assert [shards[f"{i}/3"]["state"] for i in (0, 2)] == ["done", "missing"]
    row = _rows(status)[members[1][0]]
    assert (row["state"], row["step"]) == ("starting", 3)


def test_status_reads_files_only_jax_is_never_imported(stopped):
    code = (
        "import sys\n"
        "from mhjax import cli\n"
        f"assert cli.main(['status', '--workdir', {stopped!r}]) == 0\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib', 'orbax', 'flax', 'optax'))\n"
        "print('imported:', heavy)\n"
    )
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "imported: []" in out.stdout


def test_a_run_follows_its_sweep_before_results_json(stopped):
    """A sweep stopped (or training) before its end has no results.json: the Run still names its
    members and their curves; results says when it comes (before: no member names)."""
    run = mhjax.load(stopped)
    names = [m.name for m in make_experiment(config()).members]
    assert run.member_names == names
    steps, _ = run.curves(names[0])["train/loss"]
    assert len(steps) and max(steps) < 3  # the points up to the checkpoint at 3
    with pytest.raises(
        mhjax.ConfigError, match=r"has no results.json; it is written when training ends .*\.status\(\)"
    ):
        _ = run.results
