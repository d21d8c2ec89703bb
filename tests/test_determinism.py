"""Determinism (docs/sweeps.md, "What a member equals in another sweep"): the same config and seed
give the same numbers bit for bit; a member's draws (keys, theta_0, data, dropout) are bit for bit
the same in any sweep; its training is bit for bit the same in a program of the same layout (a
diverging neighbour included) and equal to float32 round-off in another program (other members
beside it, another strategy: tests/test_sweep.py; another device count: tests/test_distributed.py)."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from tests.conftest import FAST_COMPILE, config_source, tiny_sequence_config, tiny_train
from tests.test_sweep import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _checkpoint(workdir, step):
    """The raw saved tree as {path: numpy array} (orbax metadata + arrays, no mhjax code)."""
    import orbax.checkpoint as ocp

    tree = ocp.StandardCheckpointer().restore(os.path.join(workdir, "checkpoints", str(step), "default"))
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(tree)}


SAME_CONFIG = config_source(tiny_train(tiny_sequence_config(task=("copy", "cycle"), heads=(2,)), 4, 2, 0, 0))


def _train_subprocess(config, workdir, **env_extra):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env["XLA_FLAGS"] = FAST_COMPILE  # no forced device count
    env.update(env_extra)
    proc = subprocess.run(
        [sys.executable, "-m", "mhjax", "train", "--config", str(config), "--workdir", str(workdir), "--no-progress"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return _checkpoint(str(workdir), 4), json.load(open(os.path.join(workdir, "results.json")))


@pytest.mark.slow  # ~29 s: test_growth and test_resume_records compare runs of two processes bit for bit
def test_same_config_and_seed_give_identical_results_and_params(tmp_path):
    """Two separate processes (other hash seeds; the second loads the first's compiled
    executables from JAX's persistent cache): every saved array and result bit for bit."""
    config = tmp_path / "same.py"
    config.write_text(SAME_CONFIG)
    cache = dict(
        JAX_COMPILATION_CACHE_DIR=os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(tmp_path / "cache"),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
    ca, ra = _train_subprocess(config, tmp_path / "a", PYTHONHASHSEED="1", **cache)
    cb, rb = _train_subprocess(config, tmp_path / "b", PYTHONHASHSEED="2", **cache)
    assert sorted(ca) == sorted(cb)
    for key in ca:  # params, Adam moments, counters, divergence flags
        if not key.startswith("['seconds']"):
            assert np.array_equal(ca[key], cb[key], equal_nan=True), key
    assert ra["steps"] == rb["steps"] == 4
    for a, b in zip(ra["members"], rb["members"], strict=True):
        assert {k: v for k, v in a.items() if k not in ("program_wall_time_s", "wall_time_s")} == {
            k: v for k, v in b.items() if k not in ("program_wall_time_s", "wall_time_s")
        }


def test_a_diverging_neighbour_does_not_change_the_others():
    """Same member names (lr is swept in both), so the healthy member has the same keys; in
    the second sweep its program-mate (same head count: one vmapped program) gets a huge
    learning rate and diverges."""
    calm = tiny_sequence_config(heads=(2,), learning_rate=(3e-3, 1e-3))
    wild = tiny_sequence_config(heads=(2,), learning_rate=(3e-3, 1e30))
    sc, tc = train(calm, steps=6, chunk=3)
    sw, tw = train(wild, steps=6, chunk=3)
    assert len(sw.programs) == 1
    program = sw.programs[0]
    members = [sw.experiment.members[i] for i in program.members]
    diverged = dict(zip([m["learning_rate"] for m in members], np.asarray(tw[program.name].diverged).tolist()))
    assert diverged == {3e-3: False, 1e30: True}
    healthy = next(m.name for m in members if m["learning_rate"] == 3e-3)
    assert healthy in [m.name for m in sc.experiment.members]
    # the same program layout (one program of 2 members at 2 heads, the member at the same
    # position): every parameter, Adam moment and loss bit for bit, key biases included
    calm_state, wild_state = (sweep.member_states(states)[healthy] for sweep, states in ((sc, tc), (sw, tw)))
    for a, b in zip(jax.tree_util.tree_leaves(calm_state), jax.tree_util.tree_leaves(wild_state), strict=True):
        assert np.array_equal(a, b, equal_nan=True)


# Device-count independence (1 vs 4 forced host devices) is tested in tests/test_distributed.py.
