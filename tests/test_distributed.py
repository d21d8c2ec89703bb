"""Sharding the member axis over devices and processes does not change any member."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from tests.conftest import FAST_COMPILE, config_source, tiny_sequence_config, tiny_train
from tests.test_sweep import assert_trees_close


def fused(config):
    config.strategy = "fused"
    return config


TINY_CONFIG = config_source(tiny_train(fused(tiny_sequence_config(task=("copy", "cycle"), heads=(1, 2))), 4, 2, 2, 2))


def _env(devices: int) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE}"
    env["JAX_CPU_COLLECTIVES_IMPLEMENTATION"] = "gloo"
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _train(args, devices=1):
    cmd = [sys.executable, "-m", "mhjax", "train", "--no-progress", *args]
    return subprocess.Popen(cmd, env=_env(devices), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _final_params(workdir):
    import ml_collections

    from mhjax.experiments import make_experiment
    from mhjax.io.workdir import Workdir
    from mhjax.train.loop import Sweep

    config = ml_collections.ConfigDict(json.load(open(os.path.join(workdir, "mhjax.json")))["config"])
    sweep = Sweep(make_experiment(config))
    checkpointer = Workdir(workdir).checkpointer()
    try:
        states, _ = sweep.restore(checkpointer, checkpointer.latest_step())
    finally:
        checkpointer.close()
    return {name: state.params for name, state in sweep.member_states(states).items()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    (root / "tiny.py").write_text(TINY_CONFIG)
    proc = _train(["--config", str(root / "tiny.py"), "--workdir", str(root / "single")])
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    return root, _final_params(str(root / "single"))


# ~27 s: the two-process test below shards members over devices too
@pytest.mark.slow
def test_four_devices_shard_members_and_match_one_device(reference):
    root, single = reference
    proc = _train(["--config", str(root / "tiny.py"), "--workdir", str(root / "four")], devices=4)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    four = _final_params(str(root / "four"))
    for name in single:
        assert_trees_close(single[name], four[name])


def test_placement_shards_member_axis_over_local_devices():
    code = textwrap.dedent(
        """
        import numpy as np
        from mhjax.train.placement import Placement
        p = Placement()
        x = p.put(np.arange(8.0), 8)
        assert len(x.sharding.device_set) == 4 and tuple(x.sharding.spec) == ("members",), x.sharding
        assert [s.data.shape for s in x.addressable_shards] == [(2,)] * 4
        y = p.put(np.arange(6.0), 6)  # not divisible: replicated, still correct
        assert y.sharding.is_fully_replicated
        assert np.array_equal(p.to_host(x), np.arange(8.0))
        print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", code], env=_env(4), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_train_disjoint_members_matching_one_process(reference):
    root, single = reference
    port = _free_port()
    args = [
        "--config",
        str(root / "tiny.py"),
        "--workdir",
        str(root / "multi"),
        "--coordinator",
        f"127.0.0.1:{port}",
        "--num-processes",
        "2",
    ]
    procs = [_train(args + ["--process-id", str(i)]) for i in range(2)]
    outputs = [p.communicate(timeout=600) for p in procs]
    for proc, (_, err) in zip(procs, outputs):
        assert proc.returncode == 0, err
    owned = []
    for _, err in outputs:
        line = next(line for line in err.splitlines() if "computes program all:" in line)
        owned.append(set(line.split(": ", 1)[1].split(", ")))
    assert owned[0] and owned[1] and not owned[0] & owned[1]
    assert owned[0] | owned[1] == set(single)
    multi = _final_params(str(root / "multi"))
    for name in single:
        assert_trees_close(single[name], multi[name])
    results = json.load(open(root / "multi" / "results.json"))
    assert len(results["members"]) == 4


def _read_until(proc, text, timeout=300):
    """Lines of the child's stderr up to the first holding ``text``."""
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if text in line:
            return lines
    raise AssertionError(f"no {text!r}: {''.join(lines)[-3000:]}")


# ~50 s each (two processes, a real stop): one process's stop is test_resume_records and test_preempt
@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGTERM])
def test_a_signal_to_one_process_stops_both_at_the_same_chunk_with_a_checkpoint(tmp_path, signum):
    """USR1 travels in the chunk-end gather; SIGTERM is JAX's preemption service's (its sync point)."""
    (tmp_path / "long.py").write_text(
        config_source(tiny_train(fused(tiny_sequence_config(task=("copy",), heads=(1, 2))), 100000, 1, 0, 0))
    )
    args = ["--config", str(tmp_path / "long.py"), "--workdir", str(tmp_path / "w")]
    args += ["--coordinator", f"127.0.0.1:{_free_port()}", "--num-processes", "2"]
    procs = [_train(args + ["--process-id", str(i)]) for i in range(2)]
    try:
        for proc in procs:
            _read_until(proc, "graceful stop on SIGTERM/SIGUSR1/SIGUSR2")
        procs[1].send_signal(signum)
        errs = [proc.communicate(timeout=120)[1] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    stopped = []
    for proc, err in zip(procs, errs):
        assert proc.returncode == 75, err[-3000:]
        stopped.append(int(re.search(rf"{signum.name}: stopped at step (\d+), checkpoint written; resume: ", err)[1]))
    assert stopped[0] == stopped[1] > 0
    saved = [int(d) for d in os.listdir(tmp_path / "w" / "checkpoints") if d.isdigit()]
    assert max(saved) == stopped[0]


# ---------------------------------------------------------------------------------------------- #
# Elastic resume: a sweep stopped on some devices or processes resumes on others (issue 46 item 4)
# ---------------------------------------------------------------------------------------------- #
DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "signal_driver.py")
MEASURED = ("program_wall_time_s", "wall_time_s", "member_steps_per_s", "tokens_per_s", "mfu")


def _stopped_at(args, devices, at, signum="SIGUSR1"):
    """``mhjax train args`` on ``devices`` fake devices, sent ``signum`` at ``at`` (tests/signal_driver.py)."""
    env = dict(_env(devices), MHJAX_TEST_SIGNAL=signum, MHJAX_TEST_AT=at)
    cmd = [sys.executable, DRIVER, "train", "--no-progress", *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _stop_line_step(proc) -> int:
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 75, err[-3000:]
    return int(re.search(r"SIGUSR1: stopped at step (\d+), checkpoint written", err)[1])


def _resume(args, devices=1) -> str:
    proc = _train(args, devices)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return err


def assert_results_close(reference: str, workdir: str, tol=1e-5) -> None:
    """results.json of ``workdir`` is the reference run's: every member, every field, numbers to
    ``tol`` (another device count computes in other batches: float rounding), measured rates aside."""
    want, got = (json.load(open(os.path.join(w, "results.json"))) for w in (reference, workdir))
    assert got["steps"] == want["steps"]
    for a, b in zip(want["members"], got["members"], strict=True):
        assert a.keys() == b.keys() and a["name"] == b["name"]
        for key, value in a.items():
            if key in MEASURED:
                continue
            if isinstance(value, float) or (isinstance(value, list) and value and isinstance(value[0], float)):
                assert b[key] == pytest.approx(value, rel=tol, abs=tol), (a["name"], key)
            else:
                assert b[key] == value, (a["name"], key)


def _two_processes(args, signalled=None, at="chunk:1"):
    """``mhjax train args`` as two processes of one jax.distributed job; process 1 sent ``signalled``
    at ``at`` (tests/signal_driver.py) when given. Their exit codes and stderr."""
    coordinated = args + ["--coordinator", f"127.0.0.1:{_free_port()}", "--num-processes", "2"]
    procs = [_train(coordinated + ["--process-id", "0"])]
    more = coordinated + ["--process-id", "1"]
    procs.append(_stopped_at(more, 1, at, signalled) if signalled else _train(more))
    try:
        outs = [p.communicate(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [p.returncode for p in procs], [err for _, err in outs]


@pytest.mark.slow  # ~24 s (2 processes); resume_curves' other paths run in test_resume_records and test_chaos
def test_a_one_process_checkpoint_resumes_on_two_processes_as_the_straight_run(reference, tmp_path):
    """The straight one-process run's checkpoint at step 2 (what a stop there leaves: checkpoints are
    per member) resumed by 2 processes, each computing half the members: the straight run, to 1e-5.
    The resume writes step 2's TensorBoard points again (process 0's purge): an evaluation every
    process joins (it crashed in a collective mismatch when only process 0 evaluated)."""
    import shutil

    root, single = reference
    workdir = tmp_path / "elastic"
    shutil.copytree(root / "single", workdir)
    shutil.rmtree(workdir / "checkpoints" / "4")
    for name in ("results.json", "results.md"):
        (workdir / name).unlink(missing_ok=True)
    codes, errs = _two_processes(["--config", str(root / "tiny.py"), "--workdir", str(workdir)])
    assert codes == [0, 0], [e[-3000:] for e in errs]
    assert all("resuming from checkpoint at step 2" in e for e in errs)
    assert "steps >= 2 dropped (purge_step 2); its evaluation written again" in errs[0]
    resumed = _final_params(str(workdir))
    for name in single:
        assert_trees_close(single[name], resumed[name])
    assert_results_close(str(root / "single"), str(workdir))


ELASTIC_CONFIG = config_source(
    tiny_train(fused(tiny_sequence_config(task=("copy", "cycle"), heads=(1, 2))), 6, 2, 2, 2)
)


# ~1 min loaded: four CLI runs (a straight one, then 1, 2 and 4 devices); the fast test above: 1 process -> 2
@pytest.mark.slow
def test_stopped_on_one_device_then_two_then_resumed_on_four_gives_the_straight_run(tmp_path):
    (tmp_path / "six.py").write_text(ELASTIC_CONFIG)
    straight = ["--config", str(tmp_path / "six.py"), "--workdir", str(tmp_path / "straight")]
    _resume(straight)
    args = ["--config", str(tmp_path / "six.py"), "--workdir", str(tmp_path / "w")]
    assert _stop_line_step(_stopped_at(args, 1, "chunk:1")) == 2  # steps 0-2 on one device
    assert _stop_line_step(_stopped_at(args, 2, "chunk:1")) == 4  # 2-4 on two
    err = _resume(args, devices=4)  # 4-6 on four
    assert "resuming from checkpoint at step 4" in err
    want, got = _final_params(str(tmp_path / "straight")), _final_params(str(tmp_path / "w"))
    for name in want:
        assert_trees_close(want[name], got[name])
    assert_results_close(str(tmp_path / "straight"), str(tmp_path / "w"))


# ~1 min loaded: two processes stopped by SIGUSR1 after their first chunk, resumed as one process
@pytest.mark.slow
def test_two_processes_stopped_then_resumed_as_one_give_the_straight_run(reference):
    root, single = reference
    workdir = str(root / "two-then-one")
    args = ["--config", str(root / "tiny.py"), "--workdir", workdir]
    coordinated = args + ["--coordinator", f"127.0.0.1:{_free_port()}", "--num-processes", "2"]
    procs = [_stopped_at(coordinated + ["--process-id", str(i)], 1, "chunk:1") for i in range(2)]
    assert [_stop_line_step(p) for p in procs] == [2, 2]
    err = _resume(args)
    assert "resuming from checkpoint at step 2" in err
    resumed = _final_params(workdir)
    for name in single:
        assert_trees_close(single[name], resumed[name])
    assert_results_close(str(root / "single"), workdir)


TWO_PROCESS_CONFIG = config_source(
    tiny_train(fused(tiny_sequence_config(task=("copy", "cycle"), heads=(1, 2))), 40, 2, 10, 10)
)


# ~75 s each loaded (three two-process runs): the chaos test of one process is tests/test_chaos.py
@pytest.mark.slow
@pytest.mark.parametrize("signum", ["SIGUSR1", "SIGTERM"])
def test_two_processes_signalled_in_a_chunk_resume_as_their_straight_run(tmp_path, signum):
    """Process 1 signalled in its first chunk: both stop at the same chunk end (SIGUSR1 through the
    chunk-end gather: step 2; SIGTERM at JAX's next preemption sync point), exit 75, with a
    checkpoint there; run again as two processes, results.json, parameters and every TensorBoard
    scalar are the straight two-process run's, bit for bit."""
    from tests.tb_scalars import assert_same_scalars

    (tmp_path / "forty.py").write_text(TWO_PROCESS_CONFIG)
    config = ["--config", str(tmp_path / "forty.py")]
    codes, errs = _two_processes(config + ["--workdir", str(tmp_path / "straight")])
    assert codes == [0, 0], errs[1][-3000:]
    workdir = str(tmp_path / "w")
    codes, errs = _two_processes(config + ["--workdir", workdir], signalled=signum)
    assert codes == [75, 75], [e[-2000:] for e in errs]
    stops = [int(re.search(rf"{signum}: stopped at step (\d+), checkpoint written", e)[1]) for e in errs]
    assert stops[0] == stops[1] and 0 < stops[0] < 40 and (signum != "SIGUSR1" or stops[0] == 2)
    assert max(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit()) == stops[0]
    codes, errs = _two_processes(config + ["--workdir", workdir])
    assert codes == [0, 0] and f"resuming from checkpoint at step {stops[0]}" in errs[0], errs[0][-3000:]
    want, got = _final_params(str(tmp_path / "straight")), _final_params(workdir)
    for name in want:
        assert_trees_close(want[name], got[name], tol=0)
    assert_results_close(str(tmp_path / "straight"), workdir, tol=0)
    assert_same_scalars(str(tmp_path / "straight"), workdir, sorted(want))


# ---------------------------------------------------------------------------------------------- #
# A lost process (kill -9, a node that dies): the survivor exits with the requeue code at once
# ---------------------------------------------------------------------------------------------- #
# ~25 s (two processes starting): the error classification alone is test_peers.py
@pytest.mark.slow
@pytest.mark.parametrize("victim", [1, 0])  # 0: the process that hosts the coordination service
def test_a_killed_process_ends_the_other_with_the_requeue_code_and_one_line_its_checkpoint_intact(tmp_path, victim):
    (tmp_path / "long.py").write_text(
        config_source(tiny_train(fused(tiny_sequence_config(task=("copy",), heads=(1, 2))), 100000, 5, 0, 5))
    )
    args = ["--config", str(tmp_path / "long.py"), "--workdir", str(tmp_path / "w")]
    args += ["--coordinator", f"127.0.0.1:{_free_port()}", "--num-processes", "2"]
    procs = [_train(args + ["--process-id", str(i)]) for i in range(2)]
    survivor = procs[1 - victim]
    try:
        for proc in procs:
            _read_until(proc, "graceful stop on SIGTERM/SIGUSR1/SIGUSR2")
        checkpoints = tmp_path / "w" / "checkpoints"
        deadline = time.monotonic() + 120
        while not any(d.isdigit() for d in os.listdir(checkpoints)) and time.monotonic() < deadline:
            time.sleep(0.1)
        procs[victim].kill()
        killed = time.monotonic()
        _, err = survivor.communicate(timeout=60)
        took = time.monotonic() - killed
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert survivor.returncode == 75 and took < 15, (took, err[-3000:])
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if "another process of this run is gone" in line]
    assert len(lines) == 1 and lines[0].startswith("mhjax: "), err[-3000:]
    step = int(re.search(r"the latest checkpoint \(step (\d+)\) holds the run", lines[0])[1])
    saved = [int(d) for d in os.listdir(checkpoints) if d.isdigit()]
    assert step == max(saved) > 0
    assert set(_final_params(str(tmp_path / "w"))) == {"copy-h1-s0", "copy-h2-s0"}  # it restores
