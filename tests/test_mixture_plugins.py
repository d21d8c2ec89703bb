"""The mixture experiment opened to its user: own data (with an extra data field), the squared loss
and linear attention, trained, then read back in a NEW process through mhjax.load: the NTK margin
at theta_0 rebuilt from the run's own data equals results.json's, and test_loss is the squared
loss of run.model on run.data(seed)'s test set. Plus the checks that stop a run that cannot train."""

import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mhjax.config import ConfigError, apply_overrides, load_config_file
from mhjax.experiments import make_experiment, override_defaults
from tests.test_mixture_sweep import tiny_mixture_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFIG = '''
import jax, jax.numpy as jnp, ml_collections
import mhjax


@mhjax.mixture_data("signal_at")
def sample(key, data):
    """The label's signal at one fixed position (data.signal_position), noise elsewhere."""
    k_y, k_x = jax.random.split(key)
    y = jnp.where(jax.random.bernoulli(k_y), 1.0, -1.0)
    x = jax.random.normal(k_x, (data.seq_len, data.dim))
    x = x.at[data.signal_position, 0].add(y * data.signal_norm)
    return x, y


def get_config():
    c = ml_collections.ConfigDict()
    c.experiment, c.seed = "mixture", 0
    c.sweep = ml_collections.ConfigDict(dict(heads=(1, 4), seed=(0,), num_train=(16,), step_size=(0.05,)))
    c.data = ml_collections.ConfigDict(
        dict(generator="signal_at", dim=4, seq_len=3, num_test=40, signal_position=0, signal_norm=2.0)
    )
    c.model = ml_collections.ConfigDict(dict(query="full", phi="linear"))
    c.init = ml_collections.ConfigDict(dict(scheme="random_decoders", first_step=None, tau=0.3))
    c.analysis = ml_collections.ConfigDict(dict(lanczos_iters=8, margin_iters=20000, margin_tol=1e-5))
    c.train = ml_collections.ConfigDict(
        dict(steps=20, chunk_steps=10, eval_every=0, checkpoint_every=10, loss="squared")
    )
    return c
'''

READ_BACK = """
import json, sys
import jax.numpy as jnp, numpy as np
import mhjax

run = mhjax.load(sys.argv[1])
out = {}
for r in run.results:
    name = r["name"]
    data = run.data(r["seed"])
    params = run.params(name)
    phi = np.asarray(run.model(name)(params, data.x_test))
    out[name] = {
        "ntk_margin": run.ntk(name, 0).margin,
        "gram_shape": list(run.ntk(name, 0).gram.shape),
        "test_loss": float(np.mean(0.5 * (1.0 - data.y_test * phi) ** 2)),
        "W_shape": list(params["W"].shape),
        "theta0_U": float(np.abs(run.theta0(name)["U"]).sum()),
        "signal": float(np.mean(data.x_train[:, 0, 0] * data.y_train)),
    }
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plugins")
    config_path = folder / "own.py"
    config_path.write_text(CONFIG)
    workdir = folder / "w"
    env = dict(os.environ, PYTHONPATH=ROOT)
    train = [sys.executable, "-m", "mhjax", "train", "--config", str(config_path), "--workdir", str(workdir)]
    done = subprocess.run(train + ["--no-progress"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return config_path, workdir, env


def test_own_data_squared_loss_linear_phi_read_back_in_a_new_process(trained):
    config_path, workdir, env = trained
    results = {m["name"]: m for m in json.loads((workdir / "results.json").read_text())["members"]}
    metadata = json.loads((workdir / "mhjax.json").read_text())
    assert metadata["mixture"]["data"]["signal_at"]["config"] == str(config_path)
    assert metadata["mixture"]["loss"]["squared"]["module"] == "mhjax.models.mixture_parts"
    done = subprocess.run(
        [sys.executable, "-c", READ_BACK, str(workdir)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    back = json.loads(done.stdout)
    assert set(back) == {"h1-s0", "h4-s0"}
    for name, got in back.items():
        r = results[name]
        assert r["status"] == "ok" and r["ntk_margin"] > 0
        assert got["ntk_margin"] == pytest.approx(r["ntk_margin"], rel=1e-3)
        assert got["gram_shape"] == [16, 16]
        assert got["test_loss"] == pytest.approx(r["test_loss"], rel=1e-5)
        assert got["W_shape"] == [r["heads"], 4, 4]  # unpadded to the member's own heads
        assert got["theta0_U"] > 0
        assert got["signal"] > 1.5  # the run's own data: the signal at position 0, not the stock mixture
        # Tail-dependent quantities are null for the squared loss.
        assert r["margin_loss_product"] is None and r["grad_norm_over_loss"] is None


def test_a_changed_plugin_source_is_refused_before_it_runs_again(trained):
    """run.data, run.ntk, run.analyze(steps=) rebuild from the run's plug-ins: with the data
    generator's file changed since training, each is refused in one line before the file runs
    (before: re-registered and rebuilt from the new code, silently); params need no plug-in."""
    config_path, workdir, env = trained
    original = config_path.read_text()
    code = (
        "import sys, mhjax\n"
        "from mhjax.data.mixture_data import GENERATORS\n"
        "run = mhjax.load(sys.argv[1])\n"
        "assert run.params('h1-s0') is not None\n"
        "for read in (lambda: run.data(0), lambda: run.ntk('h1-s0', 0), lambda: run.analyze(steps=[0])):\n"
        "    try:\n"
        "        read()\n"
        "    except mhjax.ConfigError as exc:\n"
        "        print(exc)\n"
        "print('registered' if 'signal_at' in GENERATORS._plugins else 'not run')\n"
    )
    try:
        config_path.write_text(original + "\nprint('the changed file ran')\n")
        done = subprocess.run([sys.executable, "-c", code, str(workdir)], env=env, capture_output=True, text=True)
    finally:
        config_path.write_text(original)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    want = (
        f"mixture.data.signal_at: its source {config_path} changed since training (sha256 differs); what is rebuilt "
        "from it would not be the run's: put it back as it was"
    )
    assert lines == [want, want, want, "not run"]


def test_run_params_at_steps_analyze_and_kept_checkpoints(trained):
    import mhjax

    _, workdir, _ = trained
    run = mhjax.load(workdir)
    assert run.checkpoint_steps == [10, 20]
    early, late = run.params("h4-s0", step=10), run.params("h4-s0")
    assert not np.allclose(early["W"], late["W"])
    with pytest.raises(ConfigError, match=r"^step: no checkpoint or snapshot at step 5 .*\(kept: 10, 20\)$"):
        run.params("h4-s0", step=5)
    rows = run.analyze(steps=[0, 20])
    assert {(r["member"], r["step"]) for r in rows} == {(n, s) for n in ("h1-s0", "h4-s0") for s in (0, 20)}
    results = {m["name"]: m for m in run.results}
    for r in rows:
        if r["step"] == 0:
            assert r["ntk_margin"] == pytest.approx(results[r["member"]]["ntk_margin"], rel=1e-3)
        else:
            assert r["test_loss"] == pytest.approx(results[r["member"]]["test_loss"], rel=1e-5)
        assert "grad_norm_over_loss" not in r  # squared loss: no exponential tail


def test_huge_tau_is_one_line_exit_2_and_never_an_ok_member(tmp_path, capsys):
    from mhjax import cli

    config = os.path.join(ROOT, "configs", "mixture_rates.py")
    workdir = tmp_path / "w"
    small = ["--config.sweep.heads=1,4", "--config.sweep.step_size=1.0", "--config.train.steps=10"]
    code = cli.main(
        ["train", "--config", config, "--workdir", str(workdir), "--no-progress", *small, "--config.init.tau=1e30"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("mhjax: error: config.init.tau: theta_0 of member h1-s0 gives a non-finite NTK Gram")
    assert not (workdir / "results.json").exists() and not (workdir / "mhjax.json").exists()


@pytest.mark.parametrize(
    "override, value",
    [
        ({"init.tau": "inf"}, "config.init.tau: must be a finite number >= 0; got inf"),
        ({"sweep.step_size": "nan,"}, "config.sweep.step_size: each must be a positive finite number; got nan"),
        ({"init.tau": "1e-3,"}, None),  # a trailing comma in a number field: the number
        ({"train.loss": "squared", "train.divergence_factor": "0"}, None),  # absent from the file
        ({"sweep.init_tau": "0.1,1.0"}, None),
        ({"train.step_rule": "cosine"}, "config.train.step_rule: unknown step rule 'cosine'"),
        ({"data.generator": "nope"}, "config.data.generator: unknown mixture data 'nope'"),
        ({"data.extra": "1"}, "config.data.extra: unknown field"),
    ],
)
def test_every_known_field_parses_alike_and_is_settable_from_the_command_line(override, value):
    config = load_config_file(os.path.join(ROOT, "configs", "mixture.py"))
    try:
        config = apply_overrides(config, override, override_defaults(config))
        make_experiment(config)
    except ConfigError as exc:
        assert value is not None and str(exc).startswith(value), str(exc)
        return
    assert value is None
    for field in override:
        node = config
        for part in field.split("."):
            node = node[part]
        assert node is not None


def _register(name, fn):
    import mhjax

    mhjax.register_mixture("data", name, fn)
    return name


@pytest.mark.parametrize(
    "sample, needle",
    [
        (lambda k, d: (jnp.zeros((d.seq_len, d.dim)), jnp.float32(1.0)), "the draws do not change with the key"),
        (lambda k, d: (jax.random.normal(k, (d.seq_len, d.dim)), jnp.float32(0.0)), "y must be -1 or +1"),
        (lambda k, d: (jax.random.normal(k, (d.dim,)), jnp.float32(1.0)), "sample must return (x, y) with x (4, 6)"),
        (lambda k, d: (jax.random.normal(k, (d.seq_len, d.dim)) / 0.0, jnp.float32(1.0)), "x must be finite"),
    ],
)
def test_a_bad_data_plugin_is_one_line_before_anything_compiles(sample, needle):
    name = _register(f"bad{abs(hash(needle)) % 10**6}", sample)
    config = tiny_mixture_config()
    config.data = {"generator": name, "dim": 6, "seq_len": 4, "num_test": 8}
    with pytest.raises(ConfigError) as info:
        make_experiment(config)
    message = str(info.value)
    assert message.startswith(f"config.data.generator: mixture data {name!r}") and needle in message, message


def _zero_label_one_in_twenty(key, data):
    """A valid example, except y = 0 for about 5% of keys (none of check_generator's 4 keys)."""
    k_y, k_x, k_bad = jax.random.split(key, 3)
    y = jnp.where(jax.random.bernoulli(k_y), 1.0, -1.0)
    y = jnp.where(jax.random.uniform(k_bad) < 0.05, 0.0, y)
    return jax.random.normal(k_x, (data.seq_len, data.dim)), y


def test_every_generated_label_is_checked_and_the_first_bad_index_named():
    """y = 0 on 1 example in 20 passes the 4-draw check but not the sampler's: one ConfigError
    naming the generator, the split and the first bad index (the run's check_start samples both
    splits before anything trains)."""
    from mhjax.data.mixture_data import sample_examples

    name = _register("zero_one_in_twenty", _zero_label_one_in_twenty)
    config = tiny_mixture_config(num_train=(64,))
    config.data = {"generator": name, "dim": 6, "seq_len": 4, "num_test": 64}
    experiment = make_experiment(config)
    for split, key, count, read in (
        ("training", experiment.data_key(0), 64, experiment.train_data),
        ("test", experiment.test_key(0), 64, experiment.test_data),
    ):
        _, y = sample_examples(_zero_label_one_in_twenty, key, experiment._sampler.data, count)
        first = int(np.flatnonzero(np.asarray(y) == 0)[0])
        with pytest.raises(ConfigError) as info:
            read(0)
        message = str(info.value)
        assert message.startswith(f"config.data.generator: mixture data {name!r}"), message
        assert f"y must be -1 or +1; {split} example {first} has y = 0.0" in message and "\n" not in message


def test_padded_examples_are_left_out_without_nan_under_an_overflowing_loss():
    """A padded example whose exp(-z) overflows contributes nothing: the loss and gradient equal
    those of the unpadded set (0 * inf would be NaN)."""
    from mhjax.models import classifier

    key = jax.random.PRNGKey(0)
    X = jax.random.normal(key, (3, 2, 2))
    X = X.at[2].set(1e4)  # the padded example: a huge negative margin
    y = jnp.array([1.0, -1.0, -1.0])
    params = classifier.init_params(key, type("S", (), {"dim": 2, "seq_len": 2}), 1, "random", 1.0)
    exp = lambda z: jnp.exp(-z)
    args = dict(loss=exp, phi=classifier.softmax)
    padded = jax.value_and_grad(classifier.margin_loss)(
        params, X, y, jnp.ones(1), 1, None, jnp.array([1.0, 1.0, 0.0]), **args
    )
    plain = jax.value_and_grad(classifier.margin_loss)(params, X[:2], y[:2], jnp.ones(1), 1, None, **args)
    for a, b in zip(jax.tree_util.tree_leaves(padded), jax.tree_util.tree_leaves(plain)):
        assert np.all(np.isfinite(np.asarray(a)))
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_divergence_factor_marks_a_member_whose_loss_grew(tmp_path):
    """Squared loss, a step far above the stability edge: L(theta_K) > 1e3 L(theta_0) without a
    non-finite value gives status "diverged"; divergence_factor = 0 turns the check off."""
    from mhjax.experiments.mixture_results import member_margin
    from mhjax.train.loop import run

    config = tiny_mixture_config(heads=(1,), num_train=(8,), step_size=(0.1, 8.0))
    config.init.scheme = "random_decoders"
    with config.train.unlocked():
        config.train.loss = "squared"
        config.train.steps, config.train.chunk_steps, config.train.eval_every = 4, 4, 0
    payload = run(make_experiment(config), str(tmp_path / "a"), progress=False, log=lambda m: None)
    status = {m["step_size"]: (m["status"], m.get("diverged_reason", "")) for m in payload["members"]}
    assert status[0.1] == ("ok", "")
    assert status[8.0][0] == "diverged" and "train.divergence_factor 1000" in status[8.0][1], status
    at = {m["step_size"]: m["diverged_at_step"] for m in payload["members"]}  # in every record, null when ok
    assert at[0.1] is None and 1 <= at[8.0] <= 4, at
    with config.train.unlocked():
        config.train.divergence_factor = 0.0
    payload = run(make_experiment(config), str(tmp_path / "b"), progress=False, log=lambda m: None)
    assert all(m["status"] == "ok" for m in payload["members"] if np.isfinite(m["train_loss"]))
    assert member_margin(np.full((2, 2), np.inf), np.ones(2), {}) == (None, None, {"radius": None})


def test_a_huge_step_that_blows_up_and_underflows_is_never_ok(tmp_path, capsys):
    """Issue 36's command, tiny: at step size 1e6 the loss rises past 1e3 x L(theta_0) and may then
    underflow to 0.0; the path check marks every member diverged at the step it first exceeded,
    the summary draws no verdict from them, and --fail-on-divergence exits 3 once all is written."""
    from mhjax.cli import main

    workdir = tmp_path / "w"
    overrides = {
        "sweep.step_size": "1e6",
        "sweep.heads": "1,4",
        "sweep.seed": "0",
        "sweep.num_train": "8,16",
        "data.dim": "6",
        "data.seq_len": "4",
        "data.num_test": "64",
        "analysis.lanczos_iters": "4",
        "train.steps": "20",
        "train.chunk_steps": "10",
        "train.checkpoint_every": "20",
        "train.eval_every": "0",
    }
    argv = ["train", "--config", os.path.join(ROOT, "configs", "mixture.py"), "--workdir", str(workdir)]
    argv += [f"--config.{k}={v}" for k, v in overrides.items()] + ["--no-progress", "--fail-on-divergence"]
    assert main(argv) == 3
    err = capsys.readouterr().err
    members = json.load(open(workdir / "results.json"))["members"]
    assert members and all(m["status"] == "diverged" for m in members)
    for m in members:
        assert (
            m["loss_exceeded_at_step"] == m["diverged_at_step"] >= 1 and m["max_train_loss"] > 1e3 * m["initial_loss"]
        )
        assert m["name"] in err.split("members diverged")[-1]  # named at the end
    summary = open(workdir / "mixture_summary.md").read()
    assert f"{len(members)} of {len(members)} members diverged" in summary
    assert "(at least the 1/S_K rate)" not in summary and "| 16 | 1e+06 |" not in summary  # no row, no verdict
    assert "--fail-on-divergence: 4 member(s) diverged" in err
    assert "**Diverged: 4 of 4 members**" in open(workdir / "results.md").read()


def test_slopes_are_read_against_the_sum_of_step_sizes():
    """S_k = sum_{j<k} eta_j: for inverse_sqrt a loss L = 1/S_k has slope -1 against S_k and about
    -0.5 against k; for the constant rule both clocks give the same slope."""
    from mhjax.experiments.mixture_results import loss_slope
    from mhjax.models import mixture_parts

    rule = mixture_parts.get("step_rule", "inverse_sqrt").fn
    ks = np.arange(0, 2001, 7)
    sums = mixture_parts.step_sums(rule, 0.5, ks)
    by_hand = np.array([sum(0.5 / math.sqrt(1 + j) for j in range(k)) for k in ks])
    np.testing.assert_allclose(sums, by_hand, rtol=1e-6)
    loss = 1.0 / np.maximum(sums, 1e-30)
    assert loss_slope(ks, loss, 2000, sums) == pytest.approx(-1.0, abs=1e-9)
    assert -0.55 < loss_slope(ks, loss, 2000) < -0.45  # the wrong clock: about half the rate
    constant = mixture_parts.step_sums(mixture_parts.get("step_rule", "constant").fn, 0.3, ks)
    np.testing.assert_allclose(constant, 0.3 * ks, rtol=1e-12)
    decay = 3.0 / np.maximum(ks, 1) ** 1.3
    assert loss_slope(ks, decay, 2000, constant) == pytest.approx(loss_slope(ks, decay, 2000), abs=1e-9)


def test_step_rule_drives_the_optimizer_and_its_sum_replaces_eta_k():
    """inverse_sqrt: step k moves theta by eta / sqrt(1 + k) times the gradient (checked against
    plain GD by hand for 2 steps), and step_sum is sum_k eta_k (eta K exactly for constant)."""
    from mhjax.models import mixture_parts
    from mhjax.train.loop import Sweep

    assert mixture_parts.step_sum(mixture_parts.get("step_rule", "constant").fn, 0.1, 7) == 0.1 * 7
    rule = mixture_parts.get("step_rule", "inverse_sqrt").fn
    assert mixture_parts.step_sum(rule, 0.5, 3) == pytest.approx(0.5 * (1 + 2**-0.5 + 3**-0.5), rel=1e-6)
    config = tiny_mixture_config(heads=(2,), num_train=(8,), step_size=(0.5,))
    config.init.scheme = "random_decoders"
    with config.train.unlocked():
        config.train.step_rule = "inverse_sqrt"
    experiment = make_experiment(config)
    sweep = Sweep(experiment)
    program = sweep.programs[0]
    states = sweep.init_states()
    recipe = program.recipe
    consts = jax.tree_util.tree_map(jnp.asarray, experiment.member_constants(experiment.members[0]))
    params = jax.tree_util.tree_map(lambda x: x[0], states[program.name].params)
    for k in range(2):
        grads = jax.grad(recipe.train_loss)(params, consts)
        params = jax.tree_util.tree_map(lambda p, g, k=k: p - 0.5 / np.sqrt(1 + k) * g, params, grads)
    states[program.name], _ = sweep.run_chunk(program, states[program.name], 2)
    for key in ("W", "U"):
        np.testing.assert_allclose(np.asarray(states[program.name].params[key][0]), params[key], rtol=1e-5, atol=1e-7)
    # eta lambda_max at the evaluation's step k uses eta_k = eta / sqrt(1 + k), not the base eta
    values = sweep.evaluate(states)[0]
    assert values["step_times_hessian_max"] == pytest.approx(0.5 / np.sqrt(3) * values["hessian_max"], rel=1e-5)


def test_a_phi_that_is_not_finite_at_zero_scores_is_refused():
    import mhjax

    mhjax.register_mixture("phi", "log_scores", lambda s: jnp.log(s))
    config = tiny_mixture_config()
    with config.model.unlocked():
        config.model.phi = "log_scores"
    with pytest.raises(ConfigError, match=r"^config\.model\.phi: phi 'log_scores' .* not finite at zero scores$"):
        make_experiment(config)
    with pytest.raises(ConfigError, match=r"^register_mixture: kind must be one of data, phi, loss, step_rule"):
        mhjax.register_mixture("optimizer", "adam", lambda x: x)
