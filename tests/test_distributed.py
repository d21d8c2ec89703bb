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
