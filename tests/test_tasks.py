"""Tasks as plug-ins: today's numbers for copy/cycle/zero, the built-in head tasks' generators,
bad tasks refused before anything compiles, weights, and a plug-in task found again later."""

import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mhjax
from mhjax import cli
from mhjax.analysis.metrics import analyze_params, random_tokens, task_sequences
from mhjax.config import ConfigError
from mhjax.data import tasks
from mhjax.experiments import make_experiment
from mhjax.experiments.sequence import weighted_mean
from mhjax.models.probe import config_sizes
from mhjax.train.loop import Sweep
from tests.conftest import tiny_sequence_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples")


# --------------------------------------------------------------------------- #
# copy, cycle and zero: exactly the numbers recorded from the code before plug-ins
# --------------------------------------------------------------------------- #
# fixed-grouped (slow, ~28 s): the fixed protocol and grouped programs run in most other tests
@pytest.mark.parametrize("setup", [pytest.param("fixed-grouped", marks=pytest.mark.slow), "fresh-fused"])
def test_copy_cycle_zero_train_eval_and_analysis_numbers_are_the_recorded_ones(setup):
    """tests/task_baseline.json: per-step losses, held-out metrics and analysis metrics of a
    6-step sweep recorded with the code before tasks became plug-ins (commit dd28ca5)."""
    recorded = json.load(open(os.path.join(ROOT, "tests", "task_baseline.json")))[setup]
    protocol, strategy = setup.split("-")
    config = tiny_sequence_config(task=("copy", "cycle", "zero"), heads=(1, 2))
    config.strategy, config.data.protocol = strategy, protocol
    experiment = make_experiment(config)
    sweep = Sweep(experiment, "cpu")
    states, losses = sweep.init_states(), {}
    for program in sweep.programs:
        for _ in range(2):
            states[program.name], metrics = sweep.run_chunk(program, states[program.name], 3)
            for j, i in enumerate(program.members):
                losses.setdefault(experiment.members[i].name, []).extend(np.asarray(metrics["loss"])[:, j].tolist())
    evaluation = sweep.evaluate(states)
    member_states = sweep.member_states(states)
    for i, member in enumerate(experiment.members):
        want = recorded[member.name]
        np.testing.assert_allclose(losses[member.name], want["losses"], rtol=RECORDED_RTOL, err_msg=member.name)
        assert evaluation[i]["eval_loss"] == pytest.approx(want["eval_loss"], rel=RECORDED_RTOL), member.name
        # 8 held-out sequences of 8 tokens: two tokens of slack
        assert evaluation[i]["eval_accuracy"] == pytest.approx(want["eval_accuracy"], abs=2 / 64), member.name
        if "analysis" in want:  # the same numbers from given tokens and from the task's sampler
            sizes = config_sizes(config.model)
            batch, _ = task_sequences(member["task"], None, 6, 0, 8, 16)
            for tokens in (random_tokens(6, 8, 16, 0), batch):
                res = analyze_params(member_states[member.name].params, member["heads"], member["task"], tokens, sizes)
                got = {k: res[k] for k in ("accuracy", "accuracy_excluding_first")}
                got.update({k: res["layers"][0][k] for k in ("mixing_time_mean", "fidelity_pct_mean")})
                assert_close_to_recorded_analysis(got, want["analysis"], member.name)


# XLA's CPU code depends on the processor: numbers recorded on one machine come out an ulp or so
# apart on another (issue 31 item 0 saw 3.1243786811828613 against 3.1243784427642822 on an AMD
# EPYC), and six Adam steps can grow that. Same-machine comparisons (resume, a member alone) keep
# exact tolerances in their own tests.
RECORDED_RTOL = 1e-5


def assert_close_to_recorded_analysis(got: dict, want: dict, name: str):
    """Analysis numbers against the recorded ones: accuracies within two tokens (6 sequences of 8
    tokens; 7 per sequence without the first), mixing time and fidelity to rel 1e-4 (they go
    through matrix powers of the attention, which amplify an ulp)."""
    assert got["accuracy"] == pytest.approx(want["accuracy"], abs=2 / 48), name
    assert got["accuracy_excluding_first"] == pytest.approx(want["accuracy_excluding_first"], abs=2 / 42), name
    for key in ("mixing_time_mean", "fidelity_pct_mean"):
        assert got[key] == pytest.approx(want[key], rel=1e-4), (name, key)


# --------------------------------------------------------------------------- #
# The built-in tasks that exercise heads
# --------------------------------------------------------------------------- #
def _draw(name, seed, length, vocab):
    return [np.asarray(a) for a in tasks.get_task(name).sample(jax.random.PRNGKey(seed), length, vocab)]


def test_recall_queries_keys_of_the_context_and_targets_their_values():
    for seed in range(5):
        x, y, w = _draw("recall", seed, 24, 20)
        pairs = 24 // 4
        keys, values = x[: 2 * pairs : 2], x[1 : 2 * pairs : 2]
        assert len(set(keys.tolist())) == pairs and keys.max() < 10 and values.min() >= 10
        binding = dict(zip(keys.tolist(), values.tolist()))
        np.testing.assert_array_equal(w, [0] * 2 * pairs + [1] * (24 - 2 * pairs))
        for t in range(2 * pairs, 24):
            assert y[t] == binding[x[t]]


def test_induction_targets_the_token_after_the_previous_occurrence_inside_the_repeat():
    for seed in range(5):
        x, y, w = _draw("induction", seed, 32, 40)
        counted = np.flatnonzero(w)
        assert len(counted) == 32 // 4 - 1 and counted.min() >= 16
        for t in counted:
            earlier = [s for s in range(t) if x[s] == x[t]]
            assert len(earlier) == 1  # segment tokens are distinct and absent from the filler
            assert y[t] == x[earlier[0] + 1] == x[t + 1]


@pytest.mark.parametrize("name, order", [("reversal", lambda v: v[::-1]), ("sorting", np.sort)])
def test_reversal_and_sorting_predict_the_transformed_sequence_after_the_separator(name, order):
    for length in (10, 11):
        x, y, w = _draw(name, 3, length, 12)
        n = length // 2
        assert x[n] == 11 and x[:n].max() < 11  # the separator is the last token
        np.testing.assert_array_equal(y[n : 2 * n], order(x[:n]))
        np.testing.assert_array_equal(x[n + 1 : 2 * n], order(x[:n])[:-1])  # teacher forcing
        np.testing.assert_array_equal(w, [0] * n + [1] * n + [0] * (length - 2 * n))


def test_tasks_have_docstrings_and_both_protocols_use_the_sampler():
    for name in ("recall", "induction", "reversal", "sorting"):
        assert len(tasks.get_task(name).sample.__doc__) > 100
    t = tasks.get_task("sorting")
    key = jax.random.PRNGKey(4)
    dataset = t.dataset(key, jnp.array([0, 3]), 10, 12)
    np.testing.assert_array_equal(dataset.inputs[1], t.sample(jax.random.fold_in(key, 3), 10, 12)[0])
    drawn = t.draw(key, 4, 10, 12)  # no batched form: sequence i from fold_in(key, i)
    for i in range(4):
        np.testing.assert_array_equal(drawn.targets[i], t.sample(jax.random.fold_in(key, i), 10, 12)[1])


# --------------------------------------------------------------------------- #
# Bad tasks fail before anything compiles
# --------------------------------------------------------------------------- #
def _sweep_with(sample, name="bad"):
    tasks._REGISTRY.pop(name, None)
    tasks.register_task(name, sample)
    return make_experiment(tiny_sequence_config(task=(name,)))


def _tokens(key, length, vocab_size):
    return jax.random.randint(key, (length,), 0, vocab_size, dtype=jnp.int32)


@pytest.mark.parametrize(
    "sample, message",
    [
        (lambda k, t, v: (_tokens(k, t, v), _tokens(k, t, v)), "must return (inputs, targets, weights)"),
        (lambda k, t, v: (_tokens(k, t + 1, v),) * 2 + (jnp.ones(t + 1),), "got (9,) int32, (9,) int32"),
        (
            lambda k, t, v: (_tokens(k, t, v), _tokens(k, t, v), jnp.ones(t, jnp.int32)),
            "(8,) int32, (8,) int32, (8,) int32",
        ),
        (lambda k, t, v: (_tokens(k, t, v),) * 2 + (jnp.zeros(t),), "weights are all zero"),
        (lambda k, t, v: (_tokens(k, t, v + 5),) * 2 + (jnp.ones(t),), "inputs must be tokens in [0, 15]"),
        (
            lambda k, t, v: (jnp.asarray(np.random.randint(0, v, t), jnp.int32),) * 2 + (jnp.ones(t),),
            "not a function of its key",
        ),
    ],
)
def test_a_bad_sample_is_a_one_line_config_error(sample, message):
    with pytest.raises(ConfigError) as exc:
        _sweep_with(sample)
    assert message in str(exc.value) and "\n" not in str(exc.value)
    assert str(exc.value).startswith("config.sweep.task: task 'bad'")


def test_unknown_and_doubly_registered_names_exit_2_with_one_line(tmp_path, capsys):
    config = tmp_path / "c.py"
    config.write_text(
        "import jax.numpy as jnp\nimport mhjax\n\n\n@mhjax.task('copy')\ndef mine(key, length, vocab_size):\n"
        "    return (jnp.zeros(length, jnp.int32),) * 2 + (jnp.ones(length),)\n\n\n"
        "def get_config():\n    from tests.conftest import tiny_sequence_config\n\n    return tiny_sequence_config()\n"
    )
    assert cli.main(["train", "--config", str(config), "--workdir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err.strip()
    assert "task 'copy': already registered by mhjax.data.sequences:copy" in err and "\n" not in err
    plain = tmp_path / "plain.py"
    plain.write_text(config.read_text().replace("@mhjax.task('copy')\n", ""))
    assert cli.main(["train", "--config", str(plain), "--dry-run", "--config.sweep.task=('nope',)"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"mhjax: error: config.sweep.task: unknown task 'nope' (registered: {', '.join(tasks.registered())})"
    )
    assert not (tmp_path / "w").exists() or not os.listdir(tmp_path / "w")


def test_registering_the_same_function_again_replaces_it():
    def sample(key, length, vocab_size):
        return _tokens(key, length, vocab_size), _tokens(key, length, vocab_size), jnp.ones(length)

    tasks._REGISTRY.pop("again", None)
    first = tasks.register_task("again", sample)
    second = tasks.register_task("again", sample)  # a notebook running its cell again
    assert tasks.get_task("again") is second and first.source == second.source
    with pytest.raises(ConfigError, match="'again': already registered by tests.test_tasks:"):
        tasks.register_task("again", _tokens)


RARE_OVERFLOW = """import jax
import jax.numpy as jnp
import mhjax


@mhjax.task("rare_overflow")
def rare_overflow(key, length, vocab_size):
    k_tok, k_bad = jax.random.split(key)
    x = jax.random.randint(k_tok, (length,), 0, vocab_size, jnp.int32)
    bad = jax.random.uniform(k_bad) < 1 / 200  # about 1 sequence in 200: the target vocab_size
    return x, x.at[-1].set(jnp.where(bad, vocab_size, x[-1])), jnp.ones(length, jnp.float32)


def get_config():
    from tests.conftest import tiny_sequence_config

    config = tiny_sequence_config(task=("rare_overflow",), heads=(1,))
    config.data.update(protocol="fresh", batch_size=16)
    config.train.update(steps=40, chunk_steps=5, eval_every=0, checkpoint_every=5)
    return config
"""


def test_a_rare_out_of_range_target_stops_training_with_one_line_and_keeps_the_last_checkpoint(tmp_path, capsys):
    """A target >= vocab_size in ~1 sequence of 200 passes the check on 3 draws; the step counts
    it, and the chunk that has one stops the run: exit 2, one line naming the task, the value
    and the range (not "diverged"), the checkpoint before that chunk the latest."""
    config = tmp_path / "rare.py"
    config.write_text(RARE_OVERFLOW)
    workdir = tmp_path / "w"
    assert cli.main(["train", "--config", str(config), "--workdir", str(workdir), "--no-progress"]) == 2
    out, err = capsys.readouterr()
    *console, err = err.strip().splitlines()  # the console's lines (compiling ...) go to stderr too
    assert err.startswith(f"mhjax: error: config.sweep.task: task 'rare_overflow' ({config}:rare_overflow) gave")
    assert "the target 16 at step " in err and "targets must be in [0, 15] (model.vocab_size = 16)" in err
    assert "Traceback" not in out + "".join(console) and "diverged" not in out + "".join(console) + err
    step = int(err.split(" at step ")[1].split()[0])
    saved = [int(d) for d in os.listdir(workdir / "checkpoints") if d.isdigit()]
    assert step >= 5 and max(saved) == step // 5 * 5  # the chunk with the bad target was not saved


# --------------------------------------------------------------------------- #
# Weights: only weighted positions count
# --------------------------------------------------------------------------- #
# ~10 s: weights are checked per task
@pytest.mark.slow
def test_targets_at_unweighted_positions_change_nothing():
    """Two tasks equal but for the targets where the weight is 0 have the same training loss,
    gradients and held-out metrics; the loss is the weighted mean over the counted positions."""

    def make(junk):
        def sample(key, length, vocab_size):
            x = _tokens(key, length, vocab_size)
            w = (jnp.arange(length) % 2).astype(jnp.float32)
            return x, jnp.where(w > 0, x, junk), w

        return sample

    results = []
    for junk in (0, 7):  # one name (keys derive from it); the same qualname replaces the first
        experiment = _sweep_with(make(junk), "odd_copy")
        sweep = Sweep(experiment, "cpu")
        (program,) = [p for p in sweep.programs if p.name == "h1"]
        states, consts = sweep.init_states(), sweep.consts["h1"]
        loss = jax.jit(jax.vmap(jax.value_and_grad(lambda p, c, recipe=program.recipe: recipe.loss(p, c, 0)[0])))
        value, grads = loss(states["h1"].params, consts)
        results.append((float(value[0]), jax.tree_util.tree_leaves(grads), sweep.evaluate(states)))
    assert results[0][0] == results[1][0] and results[0][2] == results[1][2]
    for a, b in zip(results[0][1], results[1][1]):
        np.testing.assert_array_equal(a, b)
    values, weights = jnp.array([[1.0, 2.0, 4.0], [8.0, 16.0, 32.0]]), jnp.array([[0.0, 1.0, 0.0], [1.0, 0.0, 3.0]])
    assert float(weighted_mean(values, weights)) == pytest.approx((2 + 8 + 96) / 5, rel=1e-6)
    assert float(weighted_mean(values, jnp.ones_like(values))) == float(values.mean())


# --------------------------------------------------------------------------- #
# A plug-in task: trained, analysed, reported and loaded by later commands
# --------------------------------------------------------------------------- #
def _python(code: str, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # ~80 s loaded: the other plug-in tests here cover the round trip in parts
def test_a_plugin_task_trains_analyses_reports_and_loads_from_its_recorded_source(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "path", list(sys.path))  # the example config puts its folder on it
    monkeypatch.delitem(sys.modules, "my_task", raising=False)
    examples = tmp_path / "examples"
    shutil.copytree(EXAMPLE, examples, ignore=shutil.ignore_patterns("__pycache__"))
    workdir = str(tmp_path / "w")
    config = str(examples / "my_task_config.py")
    overrides = ["--config.train.steps=4", "--config.train.chunk_steps=2", "--config.sweep.heads=(2,)"]
    assert cli.main(["train", "--config", config, "--workdir", workdir, "--no-progress", *overrides]) == 0
    recorded = json.load(open(os.path.join(workdir, "mhjax.json")))["tasks"]
    source = {"module": "my_task", "function": "first_token", "file": str(examples / "my_task.py")}
    source_sha = tasks.file_sha256(source["file"])
    assert recorded == {"first_token": {**source, "sha256": source_sha}}
    # A fresh process, where nothing registered first_token: analyze, report and load find it.
    code = (
        "import sys, mhjax\nfrom mhjax import cli\n"
        f"assert cli.main(['analyze', '--workdir', {workdir!r}, '--num-sequences', '4', '--no-plot']) == 0\n"
        f"assert cli.main(['report', '--workdir', {workdir!r}]) == 0\n"
        f"run = mhjax.load({workdir!r})\n"
        "print(run.member_names, sorted(run.analysis['members']), run.results[0]['task'])\n"
    )
    done = _python(code, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "['first_token-h2-s0'] ['first_token-h2-s0'] first_token" in done.stdout
    # a task that samples whole sequences is not described as random tokens
    assert "on 4 sequences of length 16 drawn by each task's sampler (--seed 0)" in done.stdout
    # The source changed since training: analyze refuses in one line unless --allow-changed-task.
    with open(examples / "my_task.py", "a") as f:
        f.write("# edited after training\n")
    analyze = ["analyze", "--workdir", workdir, "--num-sequences", "4", "--no-plot", "--no-tensorboard"]
    capsys.readouterr()
    assert cli.main(analyze) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"mhjax: error: task 'first_token': its source {examples / 'my_task.py'} changed since ")
    assert err.endswith("pass --allow-changed-task to go on anyway") and "\n" not in err and "Python" not in err
    # run.forward reads the task too: refused alike, in Python's words, unless allowed (then stated).
    run, name = mhjax.load(workdir), "first_token-h2-s0"
    with pytest.raises(ConfigError, match=r"changed since training .*: pass allow_changed_task=True to go on anyway$"):
        run.forward(name, np.arange(16)[None] % 16)
    out = run.forward(name, np.arange(16)[None] % 16, allow_changed_task=True)
    recorded, now = out.task_sha256["recorded"], out.task_sha256["current"]
    assert out.allow_changed_task and recorded == source_sha and now == tasks.file_sha256(source["file"]) != recorded
    assert cli.main([*analyze, "--allow-changed-task"]) == 0
    analysis = json.load(open(os.path.join(workdir, "analysis", "analysis.json")))
    assert analysis["allow_changed_task"] is True
    assert analysis["task_sha256"] == {"first_token": {"recorded": recorded, "current": now}}
    note = f"**Changed task allowed:** the source of task first_token (sha256 {recorded[:12]} at training, {now[:12]}"
    assert note in open(os.path.join(workdir, "analysis", "analysis.md")).read()
    assert cli.main(["report", "--workdir", workdir]) == 0
    assert note in open(os.path.join(workdir, "report.md")).read()
    # The source gone: a one-line error naming it, exit status 2.
    os.remove(examples / "my_task.py")
    done = _python(
        f"from mhjax import cli\nraise SystemExit(cli.main(['analyze', '--workdir', {workdir!r}]))", tmp_path
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"mhjax: error: task 'first_token': its module my_task ({examples / 'my_task.py'}, "
        f"recorded in {os.path.join(workdir, 'mhjax.json')}) is gone; {tasks.HOW_TO_REGISTER['cli']}"
    )
    # Reading needs no task code: report and load work with the source gone.
    code = (
        "import mhjax\nfrom mhjax import cli\n"
        f"assert cli.main(['report', '--workdir', {workdir!r}]) == 0\n"
        f"run = mhjax.load({workdir!r})\n"
        "name = run.member_names[0]\n"
        "print(len(run.results), sorted(run.curves(name))[:1], sorted(run.params(name)))\n"
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    out = run.forward(name, [[1, 2, 3]])\n"
        "print(out.loss is None, out.loss_by_position is None, [str(w.message) for w in caught])\n"
    )
    done = _python(code, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "1 ['analysis/accuracy'] ['block_0', 'pos_emb', 'readout', 'token_emb']" in done.stdout
    # forward with the task gone: a UserWarning saying why, and no loss
    assert "True True [\"forward: no targets from task 'first_token', so no loss: task 'first_token': its module" in (
        done.stdout
    )


def test_a_task_defined_in_main_reads_without_code_and_analyze_says_how(tmp_path):
    script = tmp_path / "train_it.py"
    script.write_text(
        "import jax, jax.numpy as jnp, mhjax\nfrom tests.conftest import tiny_sequence_config\n\n\n"
        "@mhjax.task('in_main')\ndef in_main(key, length, vocab_size):\n"
        "    x = jax.random.randint(key, (length,), 0, vocab_size, dtype=jnp.int32)\n"
        "    return x, jnp.roll(x, 1), jnp.ones(length)\n\n\n"
        f"mhjax.sweep(tiny_sequence_config(task=('in_main',), heads=(2,)), {str(tmp_path / 'w')!r}, progress=False)\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    workdir = str(tmp_path / "w")
    assert cli.main(["report", "--workdir", workdir]) == 0
    import mhjax

    run = mhjax.load(workdir)
    assert run.member_names == ["in_main-h2-s0"] and len(run.results[0]["eval_accuracy_by_position"]) == 8
    assert cli.main(["analyze", "--workdir", workdir, "--no-plot"]) == 2
    with pytest.raises(ConfigError, match=r"^task 'in_main': __main__ .* no longer registers it .*; register it in"):
        run.analyze()


def test_given_sequences_need_a_task_with_targets_from_tokens():
    tokens = np.zeros((2, 8), np.int32)
    batch, source = task_sequences("cycle", tokens, None, 0, 8, 16)
    tokens[:, 3] = 5
    batch, source = task_sequences("cycle", tokens, None, 0, 8, 16)
    np.testing.assert_array_equal(batch.targets, np.roll(tokens, 1, axis=-1))
    assert source == {"sequences": "array"} and batch.weights.min() == 1
    with pytest.raises(ConfigError, match=r"^--sequences: task 'recall' defines no targets\(tokens\)"):
        task_sequences("recall", tokens, None, 0, 8, 16)
    with pytest.raises(ConfigError, match=r"^--task: unknown task 'nope' \(registered: .*copy, cycle, "):
        task_sequences("nope", None, 4, 0, 8, 16)


def test_the_readme_task_with_targets_from_tokens_is_checked_and_its_two_forms_agree(monkeypatch):
    """examples/my_task.py's previous_token (README's own-task code): it passes the task check,
    and its targets(tokens) gives the targets its sampler draws."""
    from mhjax.data.task_check import check_task

    monkeypatch.setattr(sys, "path", [EXAMPLE, *sys.path])
    monkeypatch.delitem(sys.modules, "my_task", raising=False)
    __import__("my_task")
    task = check_task("previous_token", 8, 16)
    inputs, targets, weights = task.call_sample(jax.random.PRNGKey(3), 8, 16)
    np.testing.assert_array_equal(task.call_targets(inputs[None])[0], targets)
    np.testing.assert_array_equal(targets[1:], inputs[:-1])
    batch, _ = task_sequences(task, np.asarray(inputs)[None], None, 0, 8, 16)  # `analyze --sequences` reads it
    np.testing.assert_array_equal(batch.targets[0], targets)


def _after_first(tokens):
    """targets(tokens) with weights: the first token, undefined (weight 0) at position 0."""
    weights = jnp.ones(jnp.shape(tokens), jnp.float32).at[..., 0].set(0.0)
    return jnp.broadcast_to(tokens[..., :1], jnp.shape(tokens)), weights


def _first_token(key, length, vocab_size):
    inputs = _tokens(key, length, vocab_size)
    targets, weights = _after_first(inputs)
    return inputs, targets, weights


def test_targets_from_tokens_may_give_weights_and_given_sequences_use_them():
    """A targets form returning (targets, weights): the check passes it, `analyze --sequences`
    weighs given sequences with its weights; a weight form of another shape, or negative, is one line."""
    from mhjax.data.task_check import check_task

    tasks._REGISTRY.pop("after_first", None)
    tasks.register_task("after_first", _first_token, targets=_after_first)
    task = check_task("after_first", 8, 16)
    tokens = np.arange(16, dtype=np.int32).reshape(2, 8)
    batch, _ = task_sequences(task, tokens, None, 0, 8, 16)
    np.testing.assert_array_equal(batch.targets, [[0] * 8, [8] * 8])
    np.testing.assert_array_equal(batch.weights, [[0] + [1] * 7] * 2)
    assert batch.weights.dtype == np.float32
    bad = {
        "wrong shape": lambda x: (x, jnp.ones(x.shape[-1:], jnp.float32)),
        "negative": lambda x: (x, -jnp.ones(x.shape, jnp.float32)),
    }
    for label, form in bad.items():
        tasks._REGISTRY.pop("after_first", None)
        tasks.register_task("after_first", _first_token, targets=form)
        with pytest.raises(ConfigError) as exc:
            check_task("after_first", 8, 16)
        line = str(exc.value)
        assert line.startswith("config.sweep.task: task 'after_first'") and "targets(tokens)" in line, label
        assert ("finite and >= 0" in line) == (label == "negative") and "\n" not in line
    tasks._REGISTRY.pop("after_first", None)


def test_a_task_defined_in_a_config_file_is_found_again_by_running_that_file(tmp_path):
    config = tmp_path / "with_task.py"
    config.write_text(
        "import jax\nimport jax.numpy as jnp\nimport mhjax\n\n\n@mhjax.task('in_config')\n"
        "def in_config(key, length, vocab_size):\n"
        "    x = jax.random.randint(key, (length,), 0, vocab_size, dtype=jnp.int32)\n"
        "    return x, x, jnp.ones(length)\n\n\ndef get_config():\n    pass\n"
    )
    tasks._REGISTRY.pop("in_config", None)
    where = str(tmp_path / "mhjax.json")
    recorded = {"in_config": {"config": str(config), "function": "in_config"}}
    tasks.restore(recorded, where)
    assert tasks.get_task("in_config").source == recorded["in_config"]
    tasks._REGISTRY.pop("in_config")
    os.remove(config)
    with pytest.raises(ConfigError) as exc:
        tasks.restore(recorded, where)
    assert str(exc.value) == (
        f"task 'in_config': its config file {config} (recorded in {where}) is gone; {tasks.HOW_TO_REGISTER['python']}"
    )
