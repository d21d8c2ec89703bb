"""Task parameters (config.task_params: each value its own sampler and members, keys shared) and
tasks that cannot silently lie (a sampler ignoring its key refused; errors in task code name the
user's line)."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mhjax import cli
from mhjax.config import ConfigError, apply_overrides
from mhjax.data import tasks
from mhjax.data.task_check import check_task
from mhjax.experiments import make_experiment
from mhjax.train.loop import Sweep
from tests.conftest import ROOT, tiny_sequence_config

HERE = os.path.abspath(__file__)


def _register(name, sample, **kwargs):
    tasks._REGISTRY.pop(name, None)
    return tasks.register_task(name, sample, **kwargs)


def _tokens(key, length, vocab_size):
    return jax.random.randint(key, (length,), 0, vocab_size, dtype=jnp.int32)


# --------------------------------------------------------------------------- #
# Parameters
# --------------------------------------------------------------------------- #
def test_recall_pairs_default_is_length_over_four_and_a_value_binds():
    key = jax.random.PRNGKey(3)
    recall = tasks.get_task("recall")
    assert recall.params == {"pairs": None}
    default = [np.asarray(a) for a in recall.sample(key, 24, 20)]
    bound = [np.asarray(a) for a in recall.with_params({"pairs": 6}).call_sample(key, 24, 20)]
    for a, b in zip(default, bound):  # None means length // 4 = 6: the very same draw
        np.testing.assert_array_equal(a, b)
    x, y, w = (np.asarray(a) for a in recall.with_params({"pairs": 3}).call_sample(key, 24, 20))
    binding = dict(zip(x[:6:2].tolist(), x[1:6:2].tolist()))
    np.testing.assert_array_equal(w, [0] * 6 + [1] * 18)
    assert all(y[t] == binding[x[t]] for t in range(6, 24))
    with pytest.raises(ConfigError, match=r"pairs must be an integer in \[1, 8\]"):
        check_task("recall", 24, 16, params={"pairs": 12})


# ~20 s: test_sweep checks shared draws over learning rates
@pytest.mark.slow
def test_a_swept_task_parameter_makes_members_that_share_their_keys():
    config = apply_overrides(
        tiny_sequence_config(task=("copy", "recall"), heads=(2,)), {"task_params.recall.pairs": "1,2"}
    )
    experiment = make_experiment(config)
    names = [m.name for m in experiment.members]
    assert names == ["copy-h2-s0", "recall-pairs1-h2-s0", "recall-pairs2-h2-s0"]
    assert experiment.members[1].hparams == {
        "task": "recall",
        "task_params": {"pairs": 1},
        "heads": 2,
        "seed": 0,
        "learning_rate": 3e-3,
    }
    assert experiment.members[0].hparams == {"task": "copy", "heads": 2, "seed": 0, "learning_rate": 3e-3}
    one, two = (experiment.member_constants(m) for m in experiment.members[1:])
    for field in ("key", "data_key", "eval_key"):  # parameters stay out of every key: a paired comparison
        np.testing.assert_array_equal(getattr(one, field), getattr(two, field))
    assert (one.task_id, two.task_id) == (1, 2)
    # A member trained in the sweep equals the same member trained alone with its value fixed.
    alone = make_experiment(
        apply_overrides(tiny_sequence_config(task=("recall",), heads=(2,)), {"task_params.recall.pairs": "2"})
    )
    assert [(m.name, m.earlier) for m in alone.members] == [("recall-pairs2-h2-s0", "recall-h2-s0")]
    got = []
    for exp in (experiment, alone):
        sweep = Sweep(exp, "cpu")
        states = sweep.train(sweep.init_states(), 3, 3)
        got.append(sweep.evaluate(states)[len(exp.members) - 1])
    assert got[0] == got[1]


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"task_params.recall.size": "3"}, "config.task_params.recall.size: task 'recall' has no such parameter"),
        ({"task_params.copy.pairs": "3"}, "config.task_params.copy.pairs: task 'copy' has no such parameter"),
        ({"task_params.nope.pairs": "3"}, "config.task_params.nope: unknown task 'nope' (registered: "),
        ({"task_params.recall": "3"}, "config.task_params.recall: expected config.task_params.TASK.PARAMETER"),
        ({"task_params.recall.pairs": "1,1"}, "config.task_params.recall.pairs: repeated values"),
        ({"task_params.recall.pairs": "5"}, "pairs must be an integer in [1, 3]"),
    ],
)
def test_bad_task_parameters_are_one_line(overrides, message):
    with pytest.raises(ConfigError) as exc:
        make_experiment(apply_overrides(tiny_sequence_config(task=("copy", "recall")), overrides))
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_a_plugin_declares_parameters_that_reach_every_form():
    def sample(key, length, vocab_size, shift=1):
        x = _tokens(key, length, vocab_size)
        return x, jnp.roll(x, shift), jnp.ones(length)

    t = _register("shifted", sample, params={"shift": 1}, targets=lambda tokens, shift: jnp.roll(tokens, shift, -1))
    bound = check_task("shifted", 8, 16, params={"shift": 3})
    x, y, _ = bound.call_sample(jax.random.PRNGKey(0), 8, 16)
    np.testing.assert_array_equal(y, np.roll(x, 3))
    np.testing.assert_array_equal(bound.call_targets(jnp.arange(8)), np.roll(np.arange(8), 3))
    assert t.kwargs == {"shift": 1}
    with pytest.raises(ConfigError, match="sample takes no parameter 'other'"):
        _register("shifted2", sample, params={"other": 1})
    with pytest.raises(ConfigError, match="parameter 'heads' must be an identifier other than"):
        _register("shifted3", sample, params={"heads": 1})


def test_a_negative_parameter_names_its_members_without_a_dash_of_its_own():
    """k=-1 is "kneg1" (a "-" would read as two fields, "k" and "1"); the name it had before
    (after_marker-k-1-...) is the member's earlier name, which a workdir trained then keeps."""

    def sample(key, length, vocab_size, k=1.0):
        x = _tokens(key, length, vocab_size)
        return x, jnp.roll(x, int(k)), jnp.ones(length)

    _register("after_marker", sample, params={"k": 1.0})  # a float: ints and floats
    config = apply_overrides(
        tiny_sequence_config(task=("after_marker",), heads=(4,)), {"task_params.after_marker.k": "-1,1,-2.5,2.5"}
    )
    members = make_experiment(config).members
    assert [m.name for m in members] == [
        "after_marker-kneg1-h4-s0",
        "after_marker-k1-h4-s0",
        "after_marker-kneg2.5-h4-s0",
        "after_marker-k2.5-h4-s0",
    ]
    assert [m.hparams["task_params"]["k"] for m in members] == [-1, 1, -2.5, 2.5]
    assert [m.earlier for m in members] == ["after_marker-k-1-h4-s0", None, "after_marker-k-2.5-h4-s0", None]
    tasks._REGISTRY.pop("after_marker")


TYPED = """import jax
import jax.numpy as jnp
import mhjax


@mhjax.task("typed", params={"cap": 3, "scale": 0.5, "flag": False})
def typed(key, length, vocab_size, cap, scale, flag):
    x = jax.random.randint(key, (length,), 0, vocab_size, jnp.int32)
    return x, jnp.minimum(x, cap), jnp.ones(length, jnp.float32)


def get_config():
    from tests.conftest import tiny_sequence_config

    config = tiny_sequence_config(task=("typed", "recall"), heads=(1,))
    config.task_params = {"recall": {"pairs": 1}, "typed": {"cap": 2}}
    return config
"""


@pytest.mark.parametrize(
    "params, error",
    [
        ({"cap": 2.5}, "expected an int (the default is 3), got 2.5 (float)"),
        ({"cap": "true"}, "expected an int (the default is 3), got 'true' (str)"),
        ({"cap": (2, True)}, "expected an int (the default is 3), got True (bool)"),
        ({"flag": 1}, "expected a bool (True or False) (the default is False), got 1 (int)"),
        ({"scale": "0.1"}, "expected a float (or an int) (the default is 0.5), got '0.1' (str)"),
        ({"cap": (2, 4), "scale": 2, "flag": True}, None),  # an int for a float
    ],
)
def test_a_parameter_with_an_int_float_or_bool_default_refuses_another_type(params, error):
    from mhjax.experiments import task_params

    _register("typed_unit", lambda key, length, vocab_size, cap, scale, flag: None, params=TYPED_DEFAULTS)
    config = tiny_sequence_config(task=("typed_unit",))
    config.task_params = {"typed_unit": params}
    if error is None:
        assert len(task_params.variants(config)["typed_unit"]) == 2
        return
    with pytest.raises(ConfigError) as exc:
        task_params.variants(config)
    field = f"config.task_params.typed_unit.{next(iter(params))}"
    assert str(exc.value) == f"{field}: {error}"


TYPED_DEFAULTS = {"cap": 3, "scale": 0.5, "flag": False}


def test_the_cli_refuses_a_mistyped_parameter_and_ignores_one_of_a_task_left_out(tmp_path, capsys):
    """cap=true arrives as the string 'true': exit 2, one line. A config's task_params for a
    registered task the sweep leaves out is named in one line and ignored."""
    tasks._REGISTRY.pop("typed", None)
    config = tmp_path / "typed.py"
    config.write_text(TYPED)
    dry = ["train", "--config", str(config), "--dry-run"]
    assert cli.main([*dry, "--config.task_params.typed.cap=true"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "mhjax: error: config.task_params.typed.cap: expected an int (the default is 3), got 'true' (str)"
    assert cli.main([*dry, "--config.sweep.task=copy"]) == 0
    out = capsys.readouterr().out
    assert "config.task_params: ignoring recall, typed, not in config.sweep.task (copy)" in out.splitlines()
    assert "copy-h1-s0" in out and "typed" not in out.replace("ignoring recall, typed,", "")


# --------------------------------------------------------------------------- #
# Tasks that cannot silently lie
# --------------------------------------------------------------------------- #
def test_a_sampler_that_ignores_its_key_is_refused():
    def fixed(key, length, vocab_size):
        x = jnp.arange(length, dtype=jnp.int32) % vocab_size
        return x, x, jnp.ones(length)

    _register("fixed", fixed)
    with pytest.raises(ConfigError) as exc:
        make_experiment(tiny_sequence_config(task=("fixed",)))
    assert str(exc.value).startswith("config.sweep.task: task 'fixed'")
    assert "sample ignores its key (the draws for keys 0, 1, 2 are all equal)" in str(exc.value)


def _traced_if(key, length, vocab_size):
    x = _tokens(key, length, vocab_size)
    if x[0] > 3:  # a Python if on a traced value
        x = x + 1
    return x, x, jnp.ones(length)


LINE = _traced_if.__code__.co_firstlineno + 2


def test_an_error_in_task_code_names_the_users_line(monkeypatch):
    monkeypatch.delenv("MHJAX_TRACEBACK", raising=False)
    _register("traced_if", _traced_if)
    with pytest.raises(ConfigError) as exc:
        make_experiment(tiny_sequence_config(task=("traced_if",)))
    text = str(exc.value)
    assert "\n" not in text and "TracerBoolConversionError" in text and exc.value.__cause__ is None
    assert f"(at {HERE}:{LINE}: if x[0] > 3:" in text and text.endswith("MHJAX_TRACEBACK=1 shows the traceback")
    monkeypatch.setenv("MHJAX_TRACEBACK", "1")
    tasks._REGISTRY.pop("traced_if")
    with pytest.raises(ConfigError) as exc:
        _register("traced_if", _traced_if)
        make_experiment(tiny_sequence_config(task=("traced_if",)))
    assert type(exc.value.__cause__).__name__ == "TracerBoolConversionError"


@pytest.mark.slow  # ~22 s: a subprocess run
def test_the_command_line_prints_the_traceback_when_asked(tmp_path):
    config = tmp_path / "c.py"
    config.write_text(
        "import jax, jax.numpy as jnp, mhjax\n\n\n@mhjax.task('traced')\ndef traced(key, length, vocab_size):\n"
        "    x = jax.random.randint(key, (length,), 0, vocab_size, dtype=jnp.int32)\n"
        "    if x[0] > 3:\n        x = x + 1\n    return x, x, jnp.ones(length)\n\n\n"
        "def get_config():\n    from tests.conftest import tiny_sequence_config\n\n"
        "    return tiny_sequence_config(task=('traced',))\n"
    )
    argv = ["-m", "mhjax", "train", "--config", str(config), "--dry-run"]
    for flag, traceback in (("0", False), ("1", True)):
        env = {**os.environ, "PYTHONPATH": ROOT, "MHJAX_TRACEBACK": flag}
        done = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 2
        assert ("Traceback (most recent call last)" in done.stderr) == traceback
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("mhjax: error: config.sweep.task: task 'traced'") and f"(at {config}:7:" in last


def test_cli_override_sweeps_a_task_parameter(tmp_path, capsys):
    config = tmp_path / "c.py"
    config.write_text(
        "def get_config():\n    from tests.conftest import tiny_sequence_config\n\n"
        "    return tiny_sequence_config(task=('recall',), heads=(1,))\n"
    )
    argv = ["train", "--config", str(config), "--dry-run", "--config.task_params.recall.pairs=1,2"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "recall-pairs1-h1-s0" in out and "recall-pairs2-h1-s0" in out


# --------------------------------------------------------------------------- #
# Tables, figures and names that keep parameter values apart
# --------------------------------------------------------------------------- #
COUNT_SO_FAR = """import jax, jax.numpy as jnp, mhjax


@mhjax.task("count_so_far", params={"cap": 3})
def count_so_far(key, length, vocab_size, cap):
    x = jax.random.randint(key, (length,), 0, vocab_size, dtype=jnp.int32)
    return x, jnp.minimum(jnp.cumsum(x == 0), cap).astype(jnp.int32), jnp.ones(length)


def get_config():
    from tests.conftest import tiny_sequence_config

    return tiny_sequence_config(task=("count_so_far",), heads=(1, 2))
"""


@pytest.mark.slow  # ~48 s loaded: rows and panels of a swept parameter; its members are tested apart
def test_a_sweep_over_cap_prints_two_rows_per_head_count_and_draws_two_panels(tmp_path, capsys):
    import matplotlib.image

    config, workdir = tmp_path / "count.py", str(tmp_path / "w")
    config.write_text(COUNT_SO_FAR)
    argv = ["train", "--config", str(config), "--workdir", workdir, "--no-progress"]
    assert cli.main([*argv, "--config.task_params.count_so_far.cap=2,4"]) == 0
    out = capsys.readouterr().out
    lines = out.split("final results, mean over seeds")[1].splitlines()[1:6]
    assert lines[0].split()[:4] == ["task", "task_params", "heads", "members"]
    assert [line.split()[:4] for line in lines[1:]] == [
        ["count_so_far", "cap=2", "1", "1"],
        ["count_so_far", "cap=4", "1", "1"],
        ["count_so_far", "cap=2", "2", "1"],
        ["count_so_far", "cap=4", "2", "1"],
    ]
    assert "| name | task | task_params | heads |" in open(os.path.join(workdir, "results.md")).read()
    assert "| count_so_far-cap4-h2-s0 | count_so_far | cap=4 | 2 |" in open(os.path.join(workdir, "results.md")).read()
    assert cli.main(["analyze", "--workdir", workdir, "--num-sequences", "3", "--no-tensorboard"]) == 0
    assert cli.main(["report", "--workdir", workdir]) == 0
    report = open(os.path.join(workdir, "report.md")).read()
    assert "| task | task_params | heads | members |" in report and "| count_so_far | cap=2 | 1 | 1 |" in report
    assert "**count_so_far (cap=4): mixing time**" in report
    # analysis.png: a row of panels per cap (each row about 3.6 inches at 120 dpi)
    height = matplotlib.image.imread(os.path.join(workdir, "analysis", "analysis.png")).shape[0]
    assert height > 2 * 3.2 * 120


@pytest.mark.slow  # ~32 s loaded: trains twice; keep_names is also covered by test_growth's recorded names
def test_a_workdir_named_before_single_values_joined_the_name_keeps_its_names(tmp_path):
    """A single value of a task parameter is in new members' names; a workdir trained when it was
    not keeps its recorded names when trained longer, from results.json or, before any results
    were written (an interrupted run), from its checkpoint's keys."""
    from mhjax.workflows.train import train
    from mhjax.workflows.workdir import open_workdir
    from tests.conftest import tiny_train

    def config(steps):
        single = apply_overrides(tiny_sequence_config(task=("recall",), heads=(2,)), {"task_params.recall.pairs": "2"})
        return tiny_train(single, steps, 3, 3, 3)

    assert [m.name for m in make_experiment(config(3)).members] == ["recall-pairs2-h2-s0"]
    earlier = make_experiment(config(3))
    earlier.keep_names([m.earlier for m in earlier.members])  # as mhjax named it before
    workdir = str(tmp_path / "w")
    assert [m["name"] for m in train(earlier, workdir, progress=False, log=lambda m: None)["members"]] == [
        "recall-h2-s0"
    ]
    payload = train(make_experiment(config(6)), workdir, progress=False, log=lambda m: None)  # names from results
    assert [(m["name"], m["steps"]) for m in payload["members"]] == [("recall-h2-s0", 6)]
    os.remove(os.path.join(workdir, "results.json"))  # as if stopped before its results: names from the checkpoint
    payload = train(make_experiment(config(9)), workdir, progress=False, log=lambda m: None)
    assert [(m["name"], m["steps"]) for m in payload["members"]] == [("recall-h2-s0", 9)]
    assert os.listdir(os.path.join(workdir, "tb")) == ["recall-h2-s0"]
    assert [m.name for m in open_workdir(workdir).experiment().members] == ["recall-h2-s0"]
