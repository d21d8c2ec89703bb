"""The mixture experiment end to end: one tiny sweep through the host loop (module fixture,
reused), padding invariance against independent plain models, and config validation."""

import json
import math
import os
import shutil

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from mhjax.analysis.ntk import simplex_margin
from mhjax.config import ConfigError, load_config_file
from mhjax.data.mixture import default_mixture_config
from mhjax.experiments import make_experiment
from mhjax.io.workdir import Workdir
from mhjax.models.classifier import classifier_apply, gd_step
from mhjax.train.loop import Sweep, run
from tests.conftest import set_field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 20
EXTRA_KEYS = (
    "ntk_margin",
    "ntk_margin_gap",
    "linear_margin",
    "linear_margin_mean",
    "test_loss",
    "test_accuracy",
    "train_accuracy",
    "param_distance",
    "min_hessian_eig_over_loss_sqrtH",
    "grad_norm_over_loss",
)


def tiny_mixture_config(**sweep):
    """d=6 (the least for 1 relevant cluster per label and 4 noise clusters), T=4: seconds."""
    config = ml_collections.ConfigDict()
    config.experiment = "mixture"
    config.seed = 0
    config.strategy = "auto"
    fields = dict(heads=(2, 8), seed=(0,), num_train=(8, 16), step_size=(1.0,))
    fields.update({k: tuple(v) for k, v in sweep.items()})
    config.sweep = ml_collections.ConfigDict(fields)
    config.data = default_mixture_config()
    config.data.dim, config.data.seq_len, config.data.relevant_fraction = 6, 4, 0.5
    config.data.num_test = 64
    config.model = ml_collections.ConfigDict(dict(query="full"))
    config.init = ml_collections.ConfigDict(dict(scheme="zero_plus_step", first_step=None, tau=0.1))
    config.analysis = ml_collections.ConfigDict(dict(lanczos_iters=8, margin_iters=20000, margin_tol=1e-6))
    config.train = ml_collections.ConfigDict(
        dict(steps=STEPS, chunk_steps=10, eval_every=10, checkpoint_every=STEPS, loss_points=8)
    )
    return config


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """One run of the tiny sweep (4 members, one program): (experiment, workdir, payload)."""
    workdir = str(tmp_path_factory.mktemp("mixture"))
    experiment = make_experiment(tiny_mixture_config())
    payload = run(experiment, workdir, progress=False, log=lambda m: None)
    return experiment, workdir, payload


def by_name(payload):
    return {m["name"]: m for m in payload["members"]}


def test_results_have_the_mixture_fields_and_figures(swept):
    experiment, workdir, payload = swept
    assert list(payload["programs"]) == ["all"] and len(payload["members"]) == 4
    with open(os.path.join(workdir, "results.json")) as f:
        members = json.load(f)["members"]
    for m in members:
        assert m["status"] == "ok" and m["steps"] == STEPS and m["diverged_at_step"] is None  # a field of every record
        for key in EXTRA_KEYS:
            assert isinstance(m[key], float) and math.isfinite(m[key]), (m["name"], key)
        assert m["params"] == m["heads"] * (6 * 6 + 4 * 6)  # active heads only
        assert 0.0 <= m["test_accuracy"] <= 1.0 and m["param_distance"] > 0
        assert m["head_spread"] == 0.0  # zero_plus_step: every head the same, at theta_0 and theta_K
    for name in ("loss_vs_K.png", "test_loss_vs_n.png", "ntk_margin_vs_H.png", "mixture_summary.md"):
        assert os.path.getsize(os.path.join(workdir, name)) > 0, name
    with open(os.path.join(workdir, "mixture_summary.md")) as f:
        summary = f.read().split("## Training rate")[0]  # the main table; the rate table follows
    assert summary.count("\n| 8 | 1 | ") == 2 and summary.count("\n| 16 | 1 | ") == 2  # a row per (n, H)
    steps, losses = Workdir(workdir).curves("h2-n8-s0")["train/loss"]
    # train/loss at step s is the loss of theta_s, L(theta_s): the recorded exact curve's L(theta_k) at k = s
    assert list(steps) == list(range(STEPS)) and np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    curve = by_name(payload)["h2-n8-s0"]["loss_curve"]
    recorded = {k: v for k, v in zip(curve["steps"], curve["values"]) if k < STEPS}
    assert recorded and np.allclose([losses[k] for k in recorded], list(recorded.values()), rtol=1e-5)
    # train_loss is L(theta_K), as the evaluation's train_loss_eval and the curve's last point
    member = by_name(payload)["h2-n8-s0"]
    assert member["train_loss"] == pytest.approx(member["train_loss_eval"], rel=1e-5)
    assert member["train_loss"] == curve["values"][-1] and curve["steps"][-1] == STEPS
    assert member["initial_train_loss"] == pytest.approx(curve["values"][0], rel=1e-6)


def test_report_counts_every_figure_it_embeds(swept, capsys):
    """`mhjax report` on a mixture: "(N figures)" is the number of images report.md embeds (its
    curves.png and the experiment's own figures at the top of W)."""
    from mhjax.cli import main as cli

    _, workdir, _ = swept
    assert cli(["report", "--workdir", workdir]) == 0
    out = capsys.readouterr().out
    embedded = open(os.path.join(workdir, "report.md")).read().count("![")
    assert embedded >= 4 and f"({embedded} figures)" in out, out


def test_test_loss_vs_n_has_a_row_per_step_size_and_is_left_out_for_one_n(swept, tmp_path):
    """One n has no curve against n (the figure is skipped, the others are written); two step
    sizes give two rows of panels, not four panels squeezed into one row."""
    from PIL import Image

    from mhjax.plotting.mixture import write_figures_and_summary

    _, workdir, payload = swept
    one_n = [m for m in payload["members"] if m["num_train"] == 8]
    target = tmp_path / "one_n"
    shutil.copytree(workdir, target)
    written = [os.path.basename(p) for p in write_figures_and_summary(Workdir(str(target)), one_n, log=lambda m: None)]
    assert "test_loss_vs_n.png" not in written and "loss_vs_K.png" in written
    two_etas = payload["members"] + [dict(m, step_size=0.5) for m in payload["members"]]
    target = tmp_path / "two_etas"
    shutil.copytree(workdir, target)
    os.remove(target / "test_loss_vs_n.png")
    write_figures_and_summary(Workdir(str(target)), two_etas, log=lambda m: None)
    width, height = Image.open(target / "test_loss_vs_n.png").size
    assert height > width * 0.7, (width, height)


def test_training_drives_the_loss_down_on_separable_data(swept):
    _, _, payload = swept
    for m in payload["members"]:
        assert m["train_accuracy"] == 1.0 and m["train_loss_eval"] < 0.05, m["name"]


def test_zero_plus_one_step_gives_a_positive_ntk_margin(swept):
    """On separable data (a small n: P >> n NTK features), theta_0 = zero + one GD step
    already separates: certified margin > 0 with a small duality gap."""
    _, _, payload = swept
    for m in payload["members"]:
        assert m["ntk_margin"] > 0 and 0 <= m["ntk_margin_gap"] <= 1e-3 * m["ntk_margin"], m["name"]
        assert m["ntk_margin"] == pytest.approx(m["ntk_margin_normalized"] * m["ntk_radius"], rel=1e-9)


def plain_member(experiment, name):
    """An independent plain model of one member: its own H heads and own n examples, theta_0
    from ``classifier.gd_step`` on zero parameters, K plain GD steps."""
    member = next(m for m in experiment.members if m.name == name)
    h, n, eta = member["heads"], member["num_train"], member["step_size"]
    X, y = experiment.train_data(member["seed"])
    X, y = jnp.asarray(X[:n]), jnp.asarray(y[:n])
    d, t = experiment.config.data.dim, experiment.config.data.seq_len
    mask = jnp.ones(h)
    zero = {"W": jnp.zeros((h, d, d)), "U": jnp.zeros((h, t, d))}
    theta0, _ = gd_step(zero, X, y, eta, mask, h)
    step = jax.jit(lambda p: gd_step(p, X, y, eta, mask, h)[0])
    theta = theta0
    for _ in range(STEPS):
        theta = step(theta)
    return member, X, y, theta0, theta


def test_padded_member_equals_the_plain_model(swept):
    """h2-n8-s0 runs with H_max=8 and n_max=16 (6 masked heads, 8 zero-weight examples): its
    parameters, NTK margin and distance equal those of a plain 2-head model on its 8 examples."""
    experiment, workdir, payload = swept
    member, X, y, theta0, theta = plain_member(experiment, "h2-n8-s0")
    sweep = Sweep(experiment)
    checkpointer = Workdir(workdir).checkpointer()
    try:
        states, _ = sweep.restore(checkpointer, STEPS)
    finally:
        checkpointer.close()
    padded = sweep.member_states(states)["h2-n8-s0"].params
    for key in ("W", "U"):
        np.testing.assert_allclose(
            np.asarray(padded[key])[:2], np.asarray(theta[key]), rtol=1e-5, atol=1e-5, err_msg=key
        )
        assert not np.any(np.asarray(padded[key])[2:]), f"masked heads of {key} moved"
    # NTK margin at theta_0 from an explicit Jacobian of the plain model (reverse mode, whole batch).
    jac = jax.jacrev(lambda p: classifier_apply(p, X, jnp.ones(2), 2))(theta0)
    J = np.concatenate([np.asarray(jac[k]).reshape(X.shape[0], -1) for k in ("W", "U")], axis=1).astype(np.float64)
    margin, gap = simplex_margin(J @ J.T, np.asarray(y), tol=1e-6)
    record = by_name(payload)["h2-n8-s0"]
    assert record["ntk_margin"] == pytest.approx(margin, rel=1e-3, abs=1e-6)
    flat = lambda p: np.concatenate([np.ravel(p["W"]), np.ravel(p["U"])])
    assert record["param_distance"] == pytest.approx(np.linalg.norm(flat(theta) - flat(theta0)), rel=1e-4)


def test_member_alone_equals_member_in_the_sweep(swept):
    """The same member trained alone (H_max=2, n_max=8: no padding at all) matches the sweep."""
    experiment, workdir, payload = swept
    alone = make_experiment(tiny_mixture_config(heads=(2,), num_train=(8,)))
    sweep = Sweep(alone)
    states = sweep.train(sweep.init_states(), STEPS, 10)
    params = sweep.member_states(states)["h2-s0"].params
    _, _, _, _, theta = plain_member(experiment, "h2-n8-s0")
    for key in ("W", "U"):
        np.testing.assert_allclose(np.asarray(params[key]), np.asarray(theta[key]), rtol=1e-5, atol=1e-5, err_msg=key)


def initial_params(experiment) -> dict:
    """{member name: theta_0 (padded to the sweep's H_max)}."""
    recipe = experiment.programs("auto", "cpu")[0].recipe
    consts = lambda m: jax.tree_util.tree_map(jnp.asarray, experiment.member_constants(m))  # noqa: E731
    return {m.name: jax.tree_util.tree_map(np.asarray, recipe.init_params(consts(m))) for m in experiment.members}


@pytest.mark.parametrize("nested", [False, True])
def test_nested_heads_start_every_member_with_the_first_heads_of_a_wider_one(nested):
    """init.nested_heads: head h's draw depends on (seed, h) only, so h2's two heads are h8's first
    two; without it each head count has its own draw. Either way a member equals itself trained
    alone, in a sweep with another H_max and head counts beside it."""
    config = tiny_mixture_config(heads=(2, 8), num_train=(8,), seed=(0, 1))
    config.init.scheme, config.init.nested_heads = "random_decoders", nested
    experiment = make_experiment(config)
    theta0 = initial_params(experiment)
    for seed in (0, 1):
        narrow, wide = theta0[f"h2-s{seed}"]["U"][:2], theta0[f"h8-s{seed}"]["U"][:2]
        assert np.array_equal(narrow, wide) == nested and np.std(narrow) > 0.05
    assert not np.array_equal(theta0["h2-s0"]["U"][:2], theta0["h2-s1"]["U"][:2])  # seeds still differ
    sweep = Sweep(experiment)
    in_sweep = sweep.member_states(sweep.train(sweep.init_states(), STEPS, 10))["h2-s1"].params
    config.sweep.heads, config.sweep.seed = (2,), (1,)
    alone = Sweep(make_experiment(config))
    params = alone.member_states(alone.train(alone.init_states(), STEPS, 10))["h2-s1"].params
    for key in ("W", "U"):
        np.testing.assert_allclose(params[key], in_sweep[key][:2], rtol=1e-5, atol=1e-6, err_msg=key)
        assert not np.any(in_sweep[key][2:])


def test_random_init_of_a_head_does_not_depend_on_the_padding():
    config = tiny_mixture_config(heads=(2, 8), num_train=(8,))
    config.init.scheme = "random"
    wide = make_experiment(config)
    config.sweep.heads = (2,)
    narrow = make_experiment(config)
    p_wide = [
        wide.programs("auto", "cpu")[0].recipe.init_params(
            jax.tree_util.tree_map(jnp.asarray, wide.member_constants(m))
        )
        for m in wide.members
        if m["heads"] == 2
    ][0]
    p_narrow = narrow.programs("auto", "cpu")[0].recipe.init_params(
        jax.tree_util.tree_map(jnp.asarray, narrow.member_constants(narrow.members[0]))
    )
    for key in ("W", "U"):
        np.testing.assert_array_equal(np.asarray(p_wide[key])[:2], np.asarray(p_narrow[key]))
        assert not np.any(np.asarray(p_wide[key])[2:]) and np.std(np.asarray(p_narrow[key])) > 0.05


def test_smaller_training_set_is_a_prefix_and_test_data_are_fresh():
    experiment = make_experiment(tiny_mixture_config(num_train=(8, 16)))
    X16, y16 = experiment.train_data(0)
    small = make_experiment(tiny_mixture_config(num_train=(8,)))
    X8, y8 = small.train_data(0)
    np.testing.assert_array_equal(X16[:8], X8)
    np.testing.assert_array_equal(y16[:8], y8)
    X_test, _ = experiment.test_data(0)
    assert X_test.shape == (64, 4, 6) and not np.any(np.isclose(X_test[:16, 0, 0][:, None], X16[:, 0, 0][None]))
    X_other, _ = experiment.train_data(1)
    assert not np.allclose(X_other, X16)


@pytest.mark.parametrize(
    "field, value, needle",
    [
        ("sweep.heads", (0, 2), "config.sweep.heads"),
        ("sweep.heads", (2.5,), "config.sweep.heads"),
        ("sweep.num_train", (0,), "config.sweep.num_train"),
        ("sweep.step_size", (-1.0,), "config.sweep.step_size"),
        ("model.query", "last", "config.model.query"),
        ("init.scheme", "orthogonal", "config.init.scheme"),
        ("init.first_step", -0.5, "config.init.first_step"),
        ("init.nested_heads", 1, "config.init.nested_heads"),
        ("train.trace", "yes", "config.train.trace"),
        ("data.dim", 4, "config.data.dim"),
        ("data.relevant_fraction", 0.0, "config.data.relevant_fraction"),
        ("analysis.margin_tol", 2.0, "config.analysis.margin_tol"),
        ("train.steps", 0, "config.train.steps"),
    ],
)
def test_bad_fields_raise_one_line_naming_the_field(field, value, needle):
    config = set_field(tiny_mixture_config(), field, value)
    with pytest.raises(ConfigError) as info:
        make_experiment(config)
    message = str(info.value)
    assert message.startswith(needle) and "\n" not in message, message


def test_unknown_sweep_field_and_unknown_field_are_errors():
    config = tiny_mixture_config(learning_rate=(1.0,))
    with pytest.raises(ConfigError, match=r"^config\.sweep\.learning_rate: unknown"):
        make_experiment(config)
    config = tiny_mixture_config()
    config.model.width = 8
    with pytest.raises(ConfigError, match=r"^config\.model\.width: unknown"):
        make_experiment(config)


def test_bundled_config_is_one_program_of_42_members():
    config = load_config_file(os.path.join(ROOT, "configs", "mixture.py"))
    experiment = make_experiment(config)
    assert len(experiment.members) == 42 and experiment.max_heads == 64
    assert {m["heads"] for m in experiment.members} == {1, 2, 4, 8, 16, 32, 64}
    assert len({m["num_train"] for m in experiment.members}) >= 2 and len({m["seed"] for m in experiment.members}) == 3
    assert len(experiment.programs("auto", "cpu")) == 1


def test_first_token_query_variant_pads_like_the_plain_model():
    """query="first": theta_0 of H=2 inside H_max=8 equals classifier.gd_step on a plain 2-head model."""
    config = tiny_mixture_config(heads=(2, 8), num_train=(8,))
    config.model.query = "first"
    experiment = make_experiment(config)
    member = next(m for m in experiment.members if m["heads"] == 2)
    assert experiment.member_info(member)["params"] == 2 * (6 * 6 + 6)
    recipe = experiment.programs("auto", "cpu")[0].recipe
    theta0 = recipe.init_params(jax.tree_util.tree_map(jnp.asarray, experiment.member_constants(member)))
    X, y = (jnp.asarray(a[:8]) for a in experiment.train_data(0))
    zero = {"W": jnp.zeros((2, 6, 6)), "U": jnp.zeros((2, 6))}
    plain, _ = gd_step(zero, X, y, 1.0, jnp.ones(2), 2, "first")
    for key in ("W", "U"):
        np.testing.assert_allclose(np.asarray(theta0[key])[:2], np.asarray(plain[key]), rtol=1e-6, atol=1e-7)
        assert not np.any(np.asarray(theta0[key])[2:])
    assert np.any(np.asarray(plain["U"]))


def test_margin_figure_merges_step_sizes_only_where_their_margins_are_the_same(swept):
    """The NTK margin is taken at theta_0: members differing only in eta share it (one line per
    n), unless theta_0 took a first step of size eta (zero_plus_step): then a line per eta."""
    from matplotlib.figure import Figure

    from mhjax.plotting.mixture_geometry import plot_margin_vs_H
    from mhjax.plotting.mixture_style import Style

    _, _, payload = swept
    shared = payload["members"] + [dict(m, step_size=0.5) for m in payload["members"]]
    stepped = payload["members"] + [dict(m, step_size=0.5, ntk_margin=m["ntk_margin"] / 2) for m in payload["members"]]
    labels = {}
    for name, records in (("shared", shared), ("stepped", stepped)):
        fig = Figure()
        plot_margin_vs_H(fig, records, Style("test"))
        labels[name] = sorted(t.get_text() for t in fig.axes[0].get_legend().get_texts())
    assert labels["shared"] == ["n=16", "n=8"]
    assert labels["stepped"] == ["n=16, eta=0.5", "n=16, eta=1", "n=8, eta=0.5", "n=8, eta=1"]


def test_mixture_figures_read_at_a_glance(swept, monkeypatch):
    """path.png draws every step size (a colour and line style each) with the Hessian quantities log-log;
    test_loss_vs_n.png labels every panel's axis and fits c/(gamma^2 n) by least squares over all
    n; the summary is titled by its generator; report/curves.png is log-log for losses and tells
    step sizes apart by line style."""
    from matplotlib.figure import Figure

    from mhjax.plotting import mixture, mixture_geometry
    from mhjax.plotting.curves import plot_curves
    from mhjax.plotting.mixture_style import Style
    from mhjax.plotting.mixture_summary import summary_markdown

    _, workdir, payload = swept
    records = payload["members"] + [dict(m, step_size=0.5, name=m["name"] + "-half") for m in payload["members"]]
    steps = np.array([0.0, 2, 5, 10, 20])
    fake = {t: (steps, 0.5 + steps) for t in mixture_geometry.PATH_TAGS}
    monkeypatch.setattr(mixture_geometry, "member_curves", lambda workdir, name, tags: fake)
    fig = Figure()
    mixture_geometry.plot_path(fig, workdir, records, Style("test"))
    fig.savefig(os.devnull, format="png")
    hessian = fig.axes[2]
    assert {line.get_linestyle() for line in hessian.get_lines()[:-1]} == {"-", "--"}  # eta 1 and 0.5
    assert hessian.get_xscale() == hessian.get_yscale() == "log"
    assert [t.get_text() for t in fig.legends[0].get_texts()][:4] == ["eta=0.5", "eta=1", "H=2", "H=8"]

    fig = Figure()
    mixture._plot_test_loss_vs_n(fig, payload["members"], Style("test"))
    fig.savefig(os.devnull, format="png")
    for ax in fig.axes:  # a panel spanning less than a decade is labelled too
        low, high = ax.get_ylim()
        shown = [t.get_text() for t in ax.get_yticklabels() if low <= t.get_position()[1] <= high]
        assert len([t for t in shown if t]) >= 2, (ax.get_title(), shown)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "c/(gamma^2 n) per H, c: least squares (log) over all n" in legend
    assert mixture.theory_constant([1.0, 2.0], [3.0, 12.0]) == pytest.approx(18**0.5)  # exp(mean(log 3, log 6))

    assert summary_markdown(records).startswith("# Tokenized mixture:")
    assert summary_markdown(records, generator="my_gen").startswith("# Mixture data from generator `my_gen`:")

    figures = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: figures.append(self))
    curves = {
        r["name"]: {"train/loss": (steps, 1 / (1 + steps)), "eval/test_accuracy": (steps, 0 * steps + 1)}
        for r in records
    }
    assert plot_curves(records, curves, "unused.png", styled="step_size", log_tags=("loss",))
    loss, accuracy = figures[0].axes[:2]
    assert loss.get_xscale() == loss.get_yscale() == "log" and accuracy.get_yscale() == "linear"
    assert {line.get_linestyle() for line in loss.get_lines()} == {"-", "--"}
    assert 100 < accuracy.get_ylim()[1] < 105  # a 100% line inside the frame


def test_dry_run_prints_the_compiled_chunks_flops_and_memory(tmp_path, capsys):
    """From XLA's cost and memory analysis of the training chunk compiled here; no rate."""
    import re

    from mhjax import cli
    from tests.conftest import config_source

    path = tmp_path / "mixture.py"
    path.write_text(config_source(tiny_mixture_config()))
    assert cli.main(["train", "--config", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    found = re.search(r"program all \(4 members, chunk of 10 steps\): ([\d.e+]+) FLOPs per step \(([\d.e+]+) per", out)
    assert found and float(found[1]) > 0 and float(found[2]) == pytest.approx(float(found[1]) / 4, rel=1e-3)
    assert re.search(r"; memory [\d.]+ MiB \(arguments [\d.]+ MiB, outputs", out) and "/s" not in out
