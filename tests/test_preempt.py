"""Stopping on a scheduler's signal (train/interrupt.py, train/preempt.py): exit codes, the
second signal, a signal during the restore or compile, the stop-time prediction and its
warning, the line said at the stop. The trainer's own stop is in test_resume_records (in
process) and test_cli (the real command); two processes in test_distributed."""

import os
import signal
import subprocess
import sys
import textwrap

import ml_collections
import pytest

from mhjax.config import ConfigError
from mhjax.io import exit_clock
from mhjax.train import preempt
from mhjax.train.interrupt import EXIT_REQUEUE, EXIT_STATUS, StopOnSignal, exits_at_once

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A process holding a StopOnSignal: says "ready", then what it saw once ``raised``, then waits.
HOLDER = textwrap.dedent(
    """
    import sys, time
    from mhjax.train.interrupt import StopOnSignal
    stop = StopOnSignal(where="at the end of the running chunk").start()
    stop.preparing = sys.argv[1] == "preparing"
    print("ready", flush=True)
    while not stop.raised:
        time.sleep(0.01)
    print("raised", stop.signal_name, stop.exit_status, flush=True)
    time.sleep(600)
    """
)


def _holder(phase):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, phase], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _finish(proc):
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2])
def test_a_scheduler_signal_during_restore_or_compile_exits_at_once_with_the_requeue_code(signum):
    proc = _holder("preparing")
    proc.send_signal(signum)
    rc, _, err = _finish(proc)
    assert rc == EXIT_REQUEUE == 75, err
    assert f"{signal.Signals(signum).name} during the restore or compile: exiting now" in err
    # at once: the holder would sleep 600 s after seeing the flag (the test's timeout is 60 s)


def test_a_signal_while_training_stops_at_the_chunk_end_and_a_second_exits_at_once():
    proc = _holder("training")
    proc.send_signal(signal.SIGUSR1)
    assert proc.stdout.readline().split() == ["raised", "SIGUSR1", str(EXIT_REQUEUE)]  # still running
    proc.send_signal(signal.SIGTERM)
    rc, _, err = _finish(proc)
    assert rc == EXIT_REQUEUE, err
    assert "SIGUSR1: stopping once a checkpoint can be written (at the end of the running chunk)" in err
    assert "second signal (SIGTERM): exiting now" in err


def test_outside_the_training_loop_a_scheduler_signal_exits_at_once_with_the_requeue_code():
    code = (
        "import signal, sys, time\n"
        "from mhjax.train.interrupt import exits_at_once\n"
        "with exits_at_once([signal.SIGTERM, signal.SIGUSR2]):\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(600)\n"
    )
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGUSR2)
    rc, _, err = _finish(proc)
    assert rc == EXIT_REQUEUE and "SIGUSR2 outside training: exiting now" in err
    before = signal.getsignal(signal.SIGUSR2)
    with exits_at_once([signal.SIGUSR2]):
        assert signal.getsignal(signal.SIGUSR2) != before
    assert signal.getsignal(signal.SIGUSR2) == before  # the previous handling is back


def test_ctrl_c_keeps_130_unless_a_scheduler_signal_took_part():
    proc = _holder("training")
    proc.send_signal(signal.SIGINT)
    assert proc.stdout.readline().split() == ["raised", "SIGINT", str(EXIT_STATUS)]
    proc.send_signal(signal.SIGINT)
    assert _finish(proc)[0] == EXIT_STATUS == 130
    stop = StopOnSignal()
    stop.note(signal.SIGINT)
    stop.note(signal.SIGUSR2)
    assert stop.exit_status == EXIT_REQUEUE and stop.signal_name == "SIGINT"


def test_under_jax_distributed_sigterm_is_left_to_jax():
    before = signal.getsignal(signal.SIGUSR1)
    stop = StopOnSignal(own_sigterm=False).start()
    try:
        assert signal.getsignal(signal.SIGTERM) is not stop._handle
        assert signal.getsignal(signal.SIGUSR1) == stop._handle
    finally:
        stop.close()
    assert signal.getsignal(signal.SIGUSR1) == before


def test_stop_times_predict_chunk_plus_checkpoint_and_name_a_chunk_steps_that_fits():
    times = preempt.StopTimes(grace=30, chunk_steps=200)
    assert times.predicted is None and "measured from the first chunk" in times.start_line()
    lines = []
    times.chunk(4.0, 50, lines.append)  # a 50-step piece: 200 steps would take 16 s
    times.chunk(12.0, 200, lines.append)
    assert times.predicted == 16.0 and lines == []
    times.saved(20.0, lines.append)  # 16 + 20 > 30: room for (30 - 20) / 0.08 = 125 steps
    assert times.predicted == 36.0 and times.suggested_chunk_steps() == 125
    assert len(lines) == 1 and "~36.0 s" in lines[0] and "--config.train.chunk_steps=125" in lines[0]
    times.saved(21.0, lines.append)
    assert len(lines) == 1  # said once
    resumed = preempt.StopTimes(grace=30, chunk_steps=100, step_seconds=0.05)
    assert (
        "~5.0 s (chunk of 100 steps 5.0 s + flush and checkpoint write not yet measured + close and exit not yet "
        "measured)" in resumed.start_line()
    )
    after_a_stop = preempt.StopTimes(
        grace=30, chunk_steps=100, step_seconds=0.05, last_stop={"exit_s": 2.5, "save_s": 1.0}
    )
    assert after_a_stop.predicted == 8.5  # 5 + 1 + 2.5
    assert "(chunk of 100 steps 5.0 s + flush and checkpoint write 1.0 s + close and exit 2.5 s)" in (
        after_a_stop.start_line()
    )
    assert after_a_stop.suggested_chunk_steps() == 100  # (30 - 1 - 2.5) / 0.05 = 530, capped at 100
    slow = preempt.StopTimes(grace=10, chunk_steps=10)
    slow.chunk(1.0, 10)
    slow.saved(12.0)
    assert slow.suggested_chunk_steps() is None and "checkpoint write and exit alone do not fit" in slow.warning()


@pytest.mark.parametrize("value", [0, -1, "30", True, float("inf")])
def test_preempt_grace_s_must_be_seconds(value):
    config = ml_collections.ConfigDict({"train": {"preempt_grace_s": value}})
    with pytest.raises(ConfigError, match=r"^config\.train\.preempt_grace_s: must be a number of seconds > 0, got "):
        preempt.grace_seconds(config)
    assert preempt.grace_seconds(ml_collections.ConfigDict({"train": {}})) == 30.0


def test_the_stop_line_names_the_signal_step_and_the_command_that_resumes(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["mhjax", "train", "--config", "c.py", "--workdir=runs/a b", "--no-progress"])
    stop = StopOnSignal()
    stop.note(signal.SIGTERM)
    exc = preempt.interrupted(stop, 120, "runs/a b", saved=True)
    assert exc.exit_status == EXIT_REQUEUE
    assert str(exc) == (
        "SIGTERM: stopped at step 120, checkpoint written; resume: "
        "mhjax train --config c.py --no-progress --workdir 'runs/a b'"
    )
    ctrl_c = StopOnSignal()
    ctrl_c.note(signal.SIGINT)
    assert str(preempt.interrupted(ctrl_c, 3, "w", saved=False)) == (
        "interrupted at step 3 before training; nothing new to save, run the same command to resume"
    )


def test_the_resume_line_of_several_processes_leaves_the_coordinator_and_process_id_to_the_next_launch(monkeypatch):
    argv = ["mhjax", "train", "--config", "c.py", "--coordinator", "127.0.0.1:51285", "--num-processes", "2"]
    monkeypatch.setattr(sys, "argv", argv + ["--process-id=1", "--workdir", "w"])
    assert preempt.resume_command("w") == (
        "mhjax train --config c.py --coordinator HOST:PORT --num-processes 2 --process-id=I --workdir w"
    )


def test_a_measured_stop_is_kept_for_the_next_run_with_its_exit(tmp_path):
    stop = StopOnSignal()
    stop.note(signal.SIGTERM)
    path = str(tmp_path / "stop.json")
    times = preempt.StopTimes(grace=30, chunk_steps=10, step_seconds=0.25)
    times.saved(1.0)
    measured = preempt.MeasuredStop(path, stop, 120, times)
    exit_clock.cancel(measured._exited)
    assert preempt.MeasuredStop.read(path) is None  # not exited yet: nothing measured to the end
    measured._exited()
    record = preempt.MeasuredStop.read(path)
    assert record["step"] == 120 and record["signal"] == "SIGTERM" and record["save_s"] == 1.0
    assert record["total_s"] == pytest.approx(record["exited_at"] - stop.first_at)
    assert record["exit_s"] == pytest.approx(record["exited_at"] - record["stopped_at"])
    assert preempt.MeasuredStop.line(record).startswith("last stop (SIGTERM at step 120): ")
    assert preempt.MeasuredStop.line(record).endswith("after the checkpoint), predicted ~3.5 s")
