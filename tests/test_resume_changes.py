"""What changed between two runs of one workdir (issue 47, items 1-2): a plug-in's source file
(refused unless --allow-changed-task, then recorded with the step it took effect), the snapshot
steps (recorded; step 0 taken again exactly, other passed steps named; results.json kept), and a
field given at its default (equal to the field left out)."""

import json
import os
import shutil

import jax
import numpy as np
import pytest

from mhjax import cli
from mhjax.config import ConfigError
from mhjax.experiments import make_experiment
from mhjax.io.workdir import Workdir
from mhjax.train.engine import unstack
from mhjax.train.loop import Sweep, run
from mhjax.workflows import growth
from mhjax.workflows.train import train
from tests.conftest import set_field, tiny_sequence_config, tiny_train
from tests.errors_common import assert_one_line_error
from tests.test_mixture_sweep import tiny_mixture_config

QUIET = dict(progress=False, log=lambda m: None)

TASK_CONFIG = """
import jax, jax.numpy as jnp, ml_collections
import mhjax

MARKER = 0.15


@mhjax.task("resume_marker")
def sample(key, length, vocab_size):
    k_x, k_m = jax.random.split(key)
    x = jax.random.randint(k_x, (length,), 1, vocab_size, dtype=jnp.int32)
    x = jnp.where(jax.random.bernoulli(k_m, MARKER, (length,)), 0, x)
    return x, jnp.full((length,), x[0], jnp.int32), jnp.ones((length,), jnp.float32)


def get_config():
    return ml_collections.ConfigDict({config!r})
"""


def _metadata(workdir) -> dict:
    with open(os.path.join(workdir, "mhjax.json")) as f:
        return json.load(f)


def test_train_refuses_a_changed_task_source_and_records_an_allowed_one(tmp_path, capsys):
    config = tiny_sequence_config(task=("resume_marker",), heads=(1,))
    config_path, workdir = tmp_path / "marker.py", str(tmp_path / "w")
    config_path.write_text(TASK_CONFIG.format(config=config.to_dict()))
    train_cmd = ["train", "--config", str(config_path), "--workdir", workdir, "--no-progress"]
    assert cli.main([*train_cmd, "--config.train.steps=3"]) == 0
    before = _metadata(workdir)["tasks"]["resume_marker"]["sha256"]
    config_path.write_text(config_path.read_text().replace("MARKER = 0.15", "MARKER = 0.3"))
    capsys.readouterr()
    # trained longer (or resumed) under the edited task: refused as analyze refuses it, nothing written
    code = cli.main(train_cmd)
    line = assert_one_line_error(capsys, code, f"task 'resume_marker': its source {config_path} changed since training")
    assert line.endswith(
        "(sha256 differs); its results may not be what this code computes: pass --allow-changed-task to go on anyway"
    )
    meta = _metadata(workdir)
    assert meta["tasks"]["resume_marker"]["sha256"] == before and "resume_history" not in meta
    assert Workdir(workdir).latest_step() == 3
    # allowed: said, trained on, and mhjax.json says which steps ran under which source
    assert cli.main([*train_cmd, "--allow-changed-task"]) == 0
    assert "training on under it (allowed)" in capsys.readouterr().err
    meta, after = _metadata(workdir), _sha256(config_path)
    assert meta["tasks"]["resume_marker"]["sha256"] == after != before
    assert meta["resume_history"] == [
        {
            "step": 3,
            "source": "tasks.resume_marker",
            "file": str(config_path),
            "sha256_before": before,
            "sha256_after": after,
        }
    ]
    assert meta["extended_from_steps"] == [3] and Workdir(workdir).latest_step() == 6


def _sha256(path) -> str:
    import hashlib

    return hashlib.sha256(open(path, "rb").read()).hexdigest()


STEP_RULE = """
import mhjax


def decay(count, step_size):
    return step_size / (1.0 + 0.01 * count)


mhjax.register_mixture("step_rule", "resume_decay", decay)
"""


def test_a_mixture_plugin_is_pinned_by_sha256_and_refused_when_changed(tmp_path, monkeypatch):
    """A mixture step rule from a module of its own: recorded with its file's sha256 (mhjax's own
    plug-ins without); a resume under an edited file is refused before anything is written, and
    recorded where the train workflow allowed it. No training: mhjax.json is all that is read."""
    module = tmp_path / "resume_rules.py"
    module.write_text(STEP_RULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "resume_rules", raising=False)
    __import__("resume_rules")
    config = set_field(tiny_mixture_config(heads=(2,), num_train=(8,)), "train.step_rule", "resume_decay")
    experiment, workdir = make_experiment(config), Workdir(tmp_path / "w")
    assert not workdir.check_or_write_metadata(config.to_dict(), experiment.kind, experiment.metadata())
    recorded = _metadata(workdir.path)["mixture"]
    assert recorded["step_rule"]["resume_decay"] == {
        "module": "resume_rules",
        "function": "decay",
        "file": str(module),
        "sha256": _sha256(module),
    }
    assert "sha256" not in recorded["phi"][config.model.get("phi", "softmax")]  # mhjax's own: its version pins it
    before = _sha256(module)
    module.write_text(STEP_RULE + "# edited\n")
    with pytest.raises(ConfigError) as refused:
        train(make_experiment(config), workdir, **QUIET)
    assert str(refused.value) == (
        f"step rule 'resume_decay': its source {module} changed since training (sha256 differs); its results may "
        "not be what this code computes: pass allow_changed_task=True to go on anyway"
    )
    assert _metadata(workdir.path)["mixture"]["step_rule"]["resume_decay"]["sha256"] == before
    # allowed (check_or_write is what the train workflow reaches then): the change is recorded
    assert workdir.check_or_write_metadata(config.to_dict(), experiment.kind, make_experiment(config).metadata())
    meta = _metadata(workdir.path)
    assert meta["resume_history"] == [
        {
            "step": 0,
            "source": "mixture.step_rule.resume_decay",
            "file": str(module),
            "sha256_before": before,
            "sha256_after": _sha256(module),
        }
    ]


def test_a_field_given_at_its_default_resumes_a_workdir_that_left_it_out(tmp_path):
    """--config.train.loss=logistic (the default) on a workdir trained without train.loss: the
    same config, for the resume check and for growth; another value is still refused."""
    config = tiny_mixture_config(heads=(2,), num_train=(8,))
    assert "loss" not in config.train
    experiment, workdir = make_experiment(config), Workdir(tmp_path / "w")
    workdir.check_or_write_metadata(config.to_dict(), experiment.kind, experiment.metadata())
    explicit = make_experiment(set_field(tiny_mixture_config(heads=(2,), num_train=(8,)), "train.loss", "logistic"))
    args = (explicit.config.to_dict(), explicit.kind, explicit.metadata(), None, explicit.config_defaults)
    assert workdir.check_or_write_metadata(*args)
    assert [p.workdir.path for p in growth.plan(explicit, workdir, log=lambda m: None)] == [workdir.path]
    other = make_experiment(set_field(tiny_mixture_config(heads=(2,), num_train=(8,)), "train.loss", "squared"))
    with pytest.raises(ConfigError, match=r"another config \(config.train.loss: stored 'logistic', now 'squared'\)"):
        workdir.check_or_write_metadata(
            other.config.to_dict(), other.kind, other.metadata(), None, other.config_defaults
        )


def _sequence(steps: int, snapshot_steps):
    config = tiny_train(tiny_sequence_config(heads=(1,)), steps, 3, 3, 3)
    with config.train.unlocked():
        config.train.snapshot_steps = snapshot_steps
    return make_experiment(config)


@pytest.fixture(scope="module")
def halfway(tmp_path_factory):
    """A workdir trained to step 3 of 6, without snapshots."""
    workdir = str(tmp_path_factory.mktemp("halfway") / "w")
    run(_sequence(3, None), workdir, **QUIET)
    return workdir


def test_snapshot_steps_changed_between_runs_are_recorded_taken_or_named(halfway, tmp_path):
    workdir = str(tmp_path / "w")
    shutil.copytree(halfway, workdir)
    # resumed at 3 asking for (0, 1, 6): step 0 is theta_0, taken again exactly; step 1 is gone, named
    lines = []
    train(_sequence(6, (0, 1, 6)), workdir, progress=False, log=lines.append)
    files = Workdir(workdir)
    assert files.snapshot_steps() == [0, 6]
    sweep = Sweep(_sequence(6, (0, 1, 6)))
    theta0 = unstack(sweep.programs, {n: s.params for n, s in sweep.host(sweep.init_states()).items()})[0]
    for a, b in zip(jax.tree_util.tree_leaves(files.params("copy-h1-s0", 0)), jax.tree_util.tree_leaves(theta0)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert [line for line in lines if "step 1 passed" in line] == [
        "config.train.snapshot_steps: step 1 passed before this run (resumed at step 3) and was not kept: no "
        "snapshot there; a new workdir trains them"
    ]
    meta = _metadata(workdir)
    assert meta["resume_history"] == [{"step": 3, "field": "train.snapshot_steps", "before": None, "after": [0, 1, 6]}]
    # the finished workdir asked for other steps: recorded at 6; results.json left as the training wrote it
    results = open(os.path.join(workdir, "results.json"), "rb").read()
    lines.clear()
    train(_sequence(6, (0, 3, 6)), workdir, progress=False, log=lines.append)
    assert "training already complete at step 6; not retraining" in lines
    assert any("step 3 passed before this run (resumed at step 6)" in line for line in lines)
    assert open(os.path.join(workdir, "results.json"), "rb").read() == results
    meta = _metadata(workdir)
    assert meta["config"]["train"]["snapshot_steps"] == [0, 3, 6]
    assert meta["resume_history"][1:] == [
        {"step": 6, "field": "train.snapshot_steps", "before": [0, 1, 6], "after": [0, 3, 6]}
    ]
    # results.json lost (a full disk at the end): the same command writes it; a field given at its
    # default (train.divergence_factor, left out so far) is the same config
    os.remove(os.path.join(workdir, "results.json"))
    explicit = _sequence(6, (0, 3, 6))
    set_field(explicit.config, "train.divergence_factor", 10.0)
    payload = train(explicit, workdir, **QUIET)
    written = json.load(open(os.path.join(workdir, "results.json")))
    assert written["steps"] == 6 and written["members"] == json.loads(json.dumps(payload["members"]))
    assert written["members"] == json.loads(results)["members"]
