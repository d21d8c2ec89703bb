"""Crash-safe resume: `mhjax train` killed with SIGKILL at several points, then run again
with the same command, ends bit-identical to an uninterrupted run (CPU).

Each killed run is a real subprocess of the real CLI. To land the SIGKILL at a known
point without timing races, the subprocess is started through a tiny driver that wraps
one function (JAX compile, a training chunk, orbax's final rename of a checkpoint) so
that it writes a marker file and then waits; the test kills the process with SIGKILL as
soon as the marker appears. The run that resumes is the plain `python -m mhjax train`.

Compiles are shared across runs through JAX's persistent compilation cache (the same
executables as a fresh compile), except for the kill-during-compile run, which must
really compile.
"""

import glob
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.conftest import FAST_COMPILE, config_source, set_field, tiny_sequence_config, tiny_train
from tests.tb_scalars import assert_same_scalars

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFIG = config_source(tiny_train(tiny_sequence_config(heads=(2,), seed=(0, 1)), 9, 3, 3, 6))
STEPS, FIRST_CHECKPOINT = 9, 6  # chunks 0-3, 3-6 (checkpoint 6), 6-9 (checkpoint 9)

# Runs mhjax.cli.main in a subprocess with one function wrapped to signal "kill me now".
DRIVER = """
import os, sys, time
from tests.conftest import config_source, tiny_sequence_config, tiny_train

POINT, MARKER = os.environ["MHJAX_KILL_POINT"], os.environ["MHJAX_KILL_MARKER"]


def wait_for_kill():
    with open(MARKER + ".tmp", "w") as f:
        f.write(POINT)
    os.replace(MARKER + ".tmp", MARKER)
    time.sleep(600)
    os._exit(99)  # never reached when the test kills us


if POINT == "compile":  # the first compile (before the loop): nothing saved yet
    import jax

    original_compile = jax.stages.Lowered.compile

    def compile(self, *args, **kwargs):
        with open(MARKER, "w") as f:  # the kill lands while XLA compiles
            f.write(POINT)
        return original_compile(self, *args, **kwargs)

    jax.stages.Lowered.compile = compile
elif POINT == "chunk":  # the third chunk (steps 6-9) dispatched, its results not yet fetched
    from mhjax.train.loop import Sweep

    original_run_chunk = Sweep.run_chunk
    calls = [0]

    def run_chunk(self, *args, **kwargs):
        out = original_run_chunk(self, *args, **kwargs)
        calls[0] += 1
        if calls[0] == 3:
            wait_for_kill()
        return out

    Sweep.run_chunk = run_chunk
elif POINT == "save":  # checkpoint (or snapshot) STEP fully written to its tmp dir, not yet renamed into place
    from orbax.checkpoint._src.path import atomicity

    original_finalize = atomicity.AtomicRenameTemporaryPath.finalize
    folder = os.environ.get("MHJAX_KILL_FOLDER", "checkpoints")

    async def finalize(self, *a, **k):
        if self._final_path.name == os.environ["MHJAX_KILL_STEP"] and self._final_path.parent.name == folder:
            wait_for_kill()
        return await original_finalize(self, *a, **k)

    atomicity.AtomicRenameTemporaryPath.finalize = finalize
else:
    raise SystemExit("unknown kill point " + POINT)

from mhjax.cli import main

sys.exit(main(sys.argv[1:]))
"""


def _env(cache_dir):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = FAST_COMPILE  # no forced device count
    if cache_dir:
        env.update(
            JAX_COMPILATION_CACHE_DIR=str(cache_dir),
            JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
            JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        )
    else:  # no persistent cache (tests/conftest.py sets one): this run really compiles
        env.pop("JAX_COMPILATION_CACHE_DIR", None)
        env["MHJAX_CACHE_DIR"] = ""  # nor mhjax's default one (io/compile_cache.py)
    return env


def _train_args(config_path, workdir):
    return ["train", "--config", str(config_path), "--workdir", str(workdir), "--no-progress"]


def train(config_path, workdir, cache_dir):
    proc = subprocess.run(
        [sys.executable, "-m", "mhjax", *_train_args(config_path, workdir)],
        env=_env(cache_dir),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc


def train_and_kill(tmp_path, config_path, workdir, point, cache_dir, step=None, folder="checkpoints"):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    marker = tmp_path / f"kill-{point}"
    env = _env(cache_dir)
    env.update(MHJAX_KILL_POINT=point, MHJAX_KILL_MARKER=str(marker), MHJAX_KILL_STEP=str(step))
    env["MHJAX_KILL_FOLDER"] = folder
    proc = subprocess.Popen(
        [sys.executable, str(driver), *_train_args(config_path, workdir)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    deadline = time.monotonic() + 600
    try:
        while not marker.exists():
            if proc.poll() is not None:
                pytest.fail(
                    f"run ended (rc {proc.returncode}) before reaching kill point {point}: {proc.stderr.read()[-3000:]}"
                )
            if time.monotonic() > deadline:
                pytest.fail(f"kill point {point} not reached in time")
            time.sleep(0.01)
        proc.kill()  # SIGKILL: no handler, no cleanup, no flush
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    assert proc.returncode == -9


def complete_steps(workdir):
    return sorted(
        int(os.path.basename(p))
        for p in glob.glob(os.path.join(workdir, "checkpoints", "*"))
        if os.path.basename(p).isdigit()
    )


def load_checkpoint(workdir, step):
    """The raw saved tree (no template, no mhjax code): every array as numpy."""
    import jax
    import orbax.checkpoint as ocp

    tree = ocp.StandardCheckpointer().restore(os.path.join(workdir, "checkpoints", str(step), "default"))
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def assert_identical_runs(reference, workdir):
    ref, got = load_checkpoint(reference, STEPS), load_checkpoint(workdir, STEPS)
    assert sorted(ref) == sorted(got)
    for key in ref:
        if key.startswith("['seconds']"):  # wall time
            continue
        assert ref[key].dtype == got[key].dtype and np.array_equal(ref[key], got[key], equal_nan=True), key
    a = json.load(open(os.path.join(reference, "results.json")))
    b = json.load(open(os.path.join(workdir, "results.json")))
    assert a["steps"] == b["steps"] == STEPS
    for x, y in zip(a["members"], b["members"], strict=True):
        for k in x:
            if k not in ("program_wall_time_s", "wall_time_s"):
                assert x[k] == y[k], (x["name"], k)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The config, a shared compilation cache and the uninterrupted reference run."""
    base = tmp_path_factory.mktemp("reliability")
    config_path = base / "tiny.py"
    config_path.write_text(CONFIG)
    cache = os.environ.get("JAX_COMPILATION_CACHE_DIR") or base / "jax-cache"  # tests/conftest.py shares one
    reference = base / "reference"
    train(config_path, reference, cache)
    assert complete_steps(reference) == [FIRST_CHECKPOINT, STEPS]
    return config_path, cache, str(reference)


def _no_tmp_checkpoints(workdir):
    return not glob.glob(os.path.join(workdir, "checkpoints", "*orbax-checkpoint-tmp*"))


@pytest.mark.slow  # ~35 s: test_resume_records kill-5-6 and test_growth kill mid-chunk resume bit for bit
def test_sigkill_mid_chunk_resumes_bit_identical(setup, tmp_path):
    config_path, cache, reference = setup
    workdir = tmp_path / "w"
    train_and_kill(tmp_path, config_path, workdir, "chunk", cache)
    assert complete_steps(workdir) == [FIRST_CHECKPOINT]
    assert not (workdir / "results.json").exists()
    # Leftovers of interrupted atomic writes (tmp file + os.replace) must not break resume.
    (workdir / "mhjax.json.tmp").write_text('{"truncated')
    (workdir / "results.json.tmp").write_text('{"truncated')
    proc = train(config_path, workdir, cache)
    assert f"resuming from checkpoint at step {FIRST_CHECKPOINT}" in proc.stderr
    assert json.load(open(workdir / "results.json"))["resumed_from_step"] == FIRST_CHECKPOINT
    assert_identical_runs(reference, str(workdir))


def test_sigkill_during_checkpoint_write_resumes_bit_identical(setup, tmp_path):
    config_path, cache, reference = setup
    workdir = tmp_path / "w"
    train_and_kill(tmp_path, config_path, workdir, "save", cache, step=STEPS)
    # Killed between writing checkpoint 9 and renaming it into place: a tmp dir, not a step.
    assert complete_steps(workdir) == [FIRST_CHECKPOINT]
    assert not _no_tmp_checkpoints(workdir)
    proc = train(config_path, workdir, cache)
    assert f"resuming from checkpoint at step {FIRST_CHECKPOINT}" in proc.stderr
    assert complete_steps(workdir) == [FIRST_CHECKPOINT, STEPS] and _no_tmp_checkpoints(workdir)
    assert_identical_runs(reference, str(workdir))
    # TensorBoard: flushed before checkpoint 6 was committed, the killed run's points after it
    # (flushed before checkpoint 9, never committed) dropped at the resume: the straight run's points
    assert f"points of earlier runs at steps >= {FIRST_CHECKPOINT} dropped" in proc.stderr
    assert_same_scalars(reference, str(workdir), sorted(os.listdir(os.path.join(reference, "tb"))))


@pytest.mark.slow  # ~20 s: the checkpoint-write kill covers the same rename
def test_sigkill_during_a_snapshot_write_loses_no_snapshot_and_resumes_bit_identical(setup, tmp_path):
    """Snapshots at 0, 3, 6 and 9 (chunk ends: the plan is the reference's); killed while the
    snapshot at 6 is written, before checkpoint 6: the run again keeps 0 and 3 and writes the rest."""
    config_path, cache, reference = setup
    snap_config = tmp_path / "snap.py"
    config = tiny_train(tiny_sequence_config(heads=(2,), seed=(0, 1)), 9, 3, 3, 6)
    snap_config.write_text(config_source(set_field(config, "train.snapshot_steps", (0, 3, 6, 9))))
    workdir = tmp_path / "w"
    train_and_kill(tmp_path, snap_config, workdir, "save", cache, step=6, folder="snapshots")
    snapshots = lambda: sorted(int(p.name) for p in (workdir / "snapshots").iterdir() if p.name.isdigit())
    assert complete_steps(workdir) == [] and snapshots() == [0, 3]
    assert glob.glob(os.path.join(workdir, "snapshots", "6.orbax-checkpoint-tmp*"))
    train(snap_config, workdir, cache)
    assert snapshots() == [0, 3, 6, 9] and not glob.glob(os.path.join(workdir, "snapshots", "*tmp*"))
    assert_identical_runs(reference, str(workdir))


@pytest.mark.slow  # ~19 s: a real compile; the other kills cover resuming
def test_sigkill_during_compile_resumes_bit_identical(setup, tmp_path):
    config_path, cache, reference = setup
    workdir = tmp_path / "w"
    train_and_kill(tmp_path, config_path, workdir, "compile", cache_dir=None)  # really compiling
    assert complete_steps(workdir) == [] and (workdir / "mhjax.json").exists()
    proc = train(config_path, workdir, cache)
    assert "resuming" not in proc.stderr
    assert_identical_runs(reference, str(workdir))


def test_interrupted_metadata_write_does_not_block_a_fresh_start(setup, tmp_path):
    """Killed before W/mhjax.json was renamed into place: only its .tmp exists; the rerun
    starts fresh (no checkpoint can exist yet, metadata is written before any)."""
    from mhjax.io.workdir import Workdir

    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / (Workdir.METADATA + ".tmp")).write_text('{"mhjax_version": "0.0.0", "conf')
    assert Workdir(workdir).check_or_write_metadata({"a": 1}, "sequence") is False
    assert json.load(open(workdir / Workdir.METADATA))["config"] == {"a": 1}
    assert Workdir(workdir).check_or_write_metadata({"a": 1}, "sequence") is True


def test_resume_ignores_how_a_sweep_is_computed(tmp_path):
    """attention, strategy and devices choose how, not what: a run resumes under others."""
    from mhjax.config import ConfigError
    from mhjax.io.workdir import Workdir

    workdir = Workdir(str(tmp_path / "w"))
    first = {"a": 1, "attention": "jax", "strategy": "grouped", "devices": 0}
    assert workdir.check_or_write_metadata(first, "sequence") is False
    assert workdir.check_or_write_metadata({"a": 1, "attention": "pallas", "strategy": "fused"}, "sequence") is True
    # snapshot steps keep parameters and change no number: a run resumes with others, or with none
    trained = {**first, "train": {"steps": 9}}
    workdir = Workdir(str(tmp_path / "v"))
    assert workdir.check_or_write_metadata(trained, "sequence") is False
    again = {**trained, "train": {"steps": 9, "snapshot_steps": "log:8"}}
    assert workdir.check_or_write_metadata(again, "sequence") is True
    with pytest.raises(ConfigError, match="config.a"):
        workdir.check_or_write_metadata({**first, "a": 2}, "sequence")
