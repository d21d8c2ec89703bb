"""Chaos: `mhjax train` sent SIGTERM, SIGUSR1, SIGINT or SIGKILL at seeded moments (in a chunk, in
a checkpoint write, in a snapshot write, in the TensorBoard flush before a checkpoint), also as a
shard, then run again with the same command: results.json, every snapshot and every TensorBoard
scalar are the straight run's, bit for bit (wall-time and rate scalars, perf/*, aside).

The signalled run is a real subprocess started through tests/signal_driver.py, which sends the
signal to itself at the chosen call (no timing); the graceful ones stop at the next chunk end
(exit 75, or 130 for SIGINT; a stop that falls on the last step just finishes), SIGKILL dies on
the spot. The straight run and the resumes run in this process (cli.main), on the same single
CPU device, so the numbers agree bit for bit.
"""

import json
import os
import random
import re
import subprocess
import sys

import numpy as np
import pytest

import mhjax
from mhjax import cli
from tests.conftest import ROOT, config_source, set_field, tiny_sequence_config, tiny_train
from tests.tb_scalars import assert_same_scalars

DRIVER = os.path.join(ROOT, "tests", "signal_driver.py")
STEPS = 12  # chunks of 3; evaluations every 3; checkpoints at 6 and 12; snapshots at 0, 3, 6, 9, 12
CONFIG = set_field(
    tiny_train(tiny_sequence_config(heads=(1, 2)), STEPS, 3, 3, 6), "train.snapshot_steps", (0, 3, 6, 9, 12)
)
MEASURED = ("program_wall_time_s", "wall_time_s", "member_steps_per_s", "tokens_per_s", "mfu", "resumed_from_step")
SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT", "SIGKILL")
EXIT = {"SIGTERM": 75, "SIGUSR1": 75, "SIGINT": 130, "SIGKILL": -9}


def moment(signal_name: str, where: str) -> str:
    """The seeded moment (tests/signal_driver.py's MHJAX_TEST_AT) of ``where`` for ``signal_name``."""
    rng = random.Random(f"{signal_name}/{where}")  # a str seed: the same draw in every process
    return {
        "chunk": lambda: f"chunk:{rng.randint(1, STEPS // 3)}",  # run_chunk calls: 2 programs (a shard: 1) a chunk
        "checkpoint": lambda: f"save:checkpoints:{rng.choice([6, 12])}",
        "snapshot": lambda: f"save:snapshots:{rng.choice([3, 6, 9])}",
        "flush": lambda: f"flush:{rng.randint(1, 2)}",  # before checkpoint 6 or 12
    }[where]()


def _args(config_path, workdir, shard=None) -> list[str]:
    more = ["--shard", shard] if shard else []
    return ["train", "--config", str(config_path), "--workdir", str(workdir), "--no-progress", *more]


def signalled(args, signal_name: str, at: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT, MHJAX_TEST_SIGNAL=signal_name, MHJAX_TEST_AT=at)
    proc = subprocess.run(
        [sys.executable, DRIVER, *args], env=env, capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    # a graceful stop that falls on the last step finishes the run (0)
    assert proc.returncode in (EXIT[signal_name], 0), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc


def rerun(args) -> None:
    assert cli.main(args) == 0


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The config file and the straight run (no signal), trained in this process."""
    root = tmp_path_factory.mktemp("chaos")
    (root / "chaos.py").write_text(config_source(CONFIG))
    rerun(_args(root / "chaos.py", root / "straight"))
    return root / "chaos.py", str(root / "straight")


def _results(workdir) -> dict:
    with open(os.path.join(workdir, "results.json")) as f:
        results = json.load(f)
    members = [{k: v for k, v in m.items() if k not in MEASURED} for m in results["members"]]
    return {**{k: v for k, v in results.items() if k not in MEASURED}, "members": members}


def assert_same_run(reference: str, workdir: str) -> None:
    """results.json, every snapshot (each member's parameters) and every TensorBoard scalar."""
    assert _results(workdir) == _results(reference)
    want, got = mhjax.load(reference), mhjax.load(workdir)
    assert got.snapshot_steps == want.snapshot_steps == [0, 3, 6, 9, 12]
    import jax

    for name in want.member_names:
        for step in want.snapshot_steps:
            a, b = jax.tree_util.tree_leaves(want.params(name, step)), jax.tree_util.tree_leaves(got.params(name, step))
            assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b)), (name, step)
    assert_same_scalars(reference, workdir, want.member_names)


def test_sigterm_in_the_tensorboard_flush_before_a_checkpoint_resumes_as_the_straight_run(straight, tmp_path, capfd):
    """The fast representative: SIGTERM while the points up to checkpoint 6 are flushed; the run
    stops at the next chunk end (9) with a checkpoint there; run again, it is the straight run."""
    config_path, reference = straight
    args = _args(config_path, tmp_path / "w")
    proc = signalled(args, "SIGTERM", "flush:1")
    assert proc.returncode == 75 and "SIGTERM: stopped at step 9, checkpoint written" in proc.stderr
    assert mhjax.load(tmp_path / "w").checkpoint_steps == [6, 9]
    rerun(args)
    # the stop's measured time, from the signal to the exit, beside what the run predicted
    # (train/preempt.py MeasuredStop); the resumed run counts its close and exit in its prediction
    err = capfd.readouterr().err
    assert re.search(r"last stop \(SIGTERM at step 9\): [\d.]+ s from the signal to the exit \([\d.]+ s of it", err), (
        err
    )
    assert re.search(r"\+ close and exit [\d.]+ s\) against train.preempt_grace_s", err), err
    assert_same_run(reference, str(tmp_path / "w"))


CASES = [(s, w) for s in SIGNALS for w in ("chunk", "checkpoint", "snapshot", "flush")]


# ~8-20 s each loaded, 16 cases (a signalled subprocess, a resume): the fast test above is SIGTERM in the flush
@pytest.mark.slow
@pytest.mark.parametrize("signal_name, where", CASES, ids=[f"{s}-{w}" for s, w in CASES])
def test_a_signal_at_a_seeded_moment_then_the_same_command_gives_the_straight_run(
    straight, tmp_path, signal_name, where
):
    config_path, reference = straight
    args = _args(config_path, tmp_path / "w")
    signalled(args, signal_name, moment(signal_name, where))
    rerun(args)
    assert_same_run(reference, str(tmp_path / "w"))


# ~10 s each loaded: the one-job run's two programs as two shards, shard 0 signalled and rerun
@pytest.mark.slow
@pytest.mark.parametrize("signal_name, where", [("SIGTERM", "flush"), ("SIGKILL", "chunk"), ("SIGUSR1", "snapshot")])
def test_a_signalled_shard_resumed_gives_the_straight_one_job_run(straight, tmp_path, signal_name, where):
    config_path, reference = straight
    workdir = tmp_path / "sharded"
    signalled(_args(config_path, workdir, "0/2"), signal_name, moment(signal_name, where))
    for shard in ("0/2", "1/2"):
        rerun(_args(config_path, workdir, shard))
    assert mhjax.load(workdir).missing_members == []
    assert_same_run(reference, str(workdir))
