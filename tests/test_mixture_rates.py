"""Rates of a mixture sweep only where they are rates (issue 47, items 7-11): a step rule checked
on every step with each member's own step size before training, a plug-in loss checked at two
sizes, no rate or product from a diverged member, the step where the loss reached 0 and the
slope refused when that is inside its window, the window a setting with the fit's standard
error, and verdict words that say what was computed. One tiny run (module fixture) for the
records; the rest on the functions themselves."""

import json
import math
import os

import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import mhjax
from mhjax.config import ConfigError, apply_overrides, load_config_file
from mhjax.experiments import make_experiment, override_defaults
from mhjax.experiments.mixture_results import RATE_FIELDS, fit_loss_slope
from mhjax.io import trace
from mhjax.io.workdir import Workdir
from mhjax.models import mixture_parts
from mhjax.plotting.mixture_summary import summary_markdown
from mhjax.train.records import LOSS_FLOOR, HostRecords
from tests.test_mixture_sweep import tiny_mixture_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Step rules under test (registered once per process; the same module and function again replaces).
RULES = {
    "t_nan_from_50": lambda c, e: jnp.where(c >= 50, jnp.nan, e),
    "t_nan_where_eta_k_reaches_30": lambda c, e: jnp.where(c * e >= 30, jnp.nan, e),
    "t_ascent": lambda c, e: -0.01 * e,
    "t_zero": lambda c, e: 0.0 * e,
    "t_zero_from_10": lambda c, e: jnp.where(c >= 10, 0.0, e),
    "t_jump_at_50_for_eta_half": lambda c, e: jnp.where((c >= 50) & (e == 0.5), 1e30, e),
}
for _name, _fn in RULES.items():
    mhjax.register_mixture("step_rule", _name, _fn)


# ---------------------------------------------------------------------- #
# Item 7: the step rule on every step, each member's own step size and K
# ---------------------------------------------------------------------- #
@pytest.mark.parametrize(
    "rule, runs, message",
    [
        ("t_nan_from_50", [(0.5, 200)], "gives nan at step 50 with step size 0.5"),
        ("t_nan_from_50", [(0.5, 50)], None),  # K = 50: steps 0..49 only
        ("t_nan_where_eta_k_reaches_30", [(0.1, 100), (1.0, 100)], "gives nan at step 30 with step size 1;"),
        ("t_nan_where_eta_k_reaches_30", [(0.1, 100), (1.0, 30)], None),  # each step size its own K
        ("t_ascent", [(0.5, 200)], "gives -0.005 at step 0 with step size 0.5"),
        ("t_zero", [(0.3, 20)], "gives 0 at every step with step size 0.3"),
        ("t_zero_from_10", [(0.3, 2000)], None),  # a schedule that decays to 0 stays allowed
        ("t_zero_from_10", [(0.3, 5)], None),
        ("inverse_sqrt", [(0.1, 1000), (1.0, 10)], None),
    ],
)
def test_a_step_rule_is_checked_on_every_step_of_each_members_own_k(rule, runs, message):
    if message is None:
        mixture_parts.check_step_rule(rule, runs)
        return
    with pytest.raises(ConfigError) as info:
        mixture_parts.check_step_rule(rule, runs)
    text = str(info.value)
    assert text.startswith(f"config.train.step_rule: step rule {rule!r} (") and message in text, text
    assert "\n" not in text and "at every step 0..K-1" in text


def test_the_rule_is_read_in_chunks_without_missing_a_step(monkeypatch):
    """Chunks of 7 steps: the first bad step (50, inside the 8th chunk) and the first positive one
    are the same as in one piece; a rule positive only from step 20 is not 'zero at every step'."""
    monkeypatch.setattr(mixture_parts, "RULE_CHUNK", 7)
    nonfinite, negative, positive, value = mixture_parts.first_bad_steps(RULES["t_nan_from_50"], 0.5, 200)
    assert (nonfinite, negative, positive) == (50, 200, 0) and math.isnan(value)
    late = lambda c, e: jnp.where(c >= 20, e, 0.0)  # noqa: E731
    assert mixture_parts.first_bad_steps(late, 0.5, 30)[:3] == (30, 30, 20)
    assert mixture_parts.first_bad_steps(late, 0.5, 20)[:3] == (20, 20, 20)  # never positive below K = 20


def test_a_bad_step_rule_is_one_line_exit_2_before_anything_is_written(tmp_path, capsys):
    """The ascent rule of the issue (-0.01 eta: 'ok' while the loss rose 0.82 -> 16.3) from a
    config file: refused before the workdir is written, one line naming rule, step size and step."""
    from mhjax import cli

    config = tmp_path / "ascent.py"
    config.write_text(
        "import jax.numpy as jnp, mhjax\n"
        "from tests.test_mixture_sweep import tiny_mixture_config\n"
        "mhjax.register_mixture('step_rule', 't_cli_ascent', lambda c, e: -0.01 * e)\n"
        "def get_config():\n"
        "    c = tiny_mixture_config(heads=(1,), num_train=(8,), step_size=(0.5,))\n"
        "    c.train.step_rule = 't_cli_ascent'\n"
        "    return c\n"
    )
    workdir = tmp_path / "w"
    code = cli.main(["train", "--config", str(config), "--workdir", str(workdir), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("mhjax: error: config.train.step_rule: step rule 't_cli_ascent' (")
    assert "gives -0.005 at step 0 with step size 0.5" in err[0]
    assert not (workdir / "mhjax.json").exists() and not (workdir / "results.json").exists()


# ---------------------------------------------------------------------- #
# Item 10: a loss (and phi) checked at two sizes, neither 3
# ---------------------------------------------------------------------- #
@pytest.mark.parametrize(
    "kind, field, fn, needle",
    [
        ("loss", "train.loss", lambda z: jnp.array([1.0, 2.0, 3.0]), "must keep the input's shape (4,); got (3,)"),
        ("loss", "train.loss", lambda z: jnp.exp(-z[:3]), "must keep the input's shape (4,); got (3,)"),
        ("phi", "model.phi", lambda s: jnp.zeros((2, s.shape[-1])), "must keep the input's shape (5, 4); got (2, 4)"),
    ],
)
def test_a_part_of_a_fixed_size_is_refused_in_one_line(kind, field, fn, needle):
    """A loss returning a fixed (3,) vector passed when it was fed exactly 3 margins and crashed
    later with a traceback; fed 4 and 2 margins it is one ConfigError."""
    name = f"t_fixed_{kind}_{abs(hash(needle)) % 10**6}"
    mhjax.register_mixture(kind, name, fn)
    config = tiny_mixture_config()
    section, key = field.split(".")
    with config[section].unlocked():
        config[section][key] = name
    with pytest.raises(ConfigError) as info:
        make_experiment(config)
    text = str(info.value)
    assert text.startswith(f"config.{field}: {kind} {name!r}") and needle in text and "\n" not in text, text


# ---------------------------------------------------------------------- #
# Items 8, 9, 11: one tiny run with a healthy, a zero-loss and a diverged member
# ---------------------------------------------------------------------- #
@pytest.fixture(scope="module")
def rates_run(tmp_path_factory):
    """eta 0.25: healthy; eta 0.5: the rule jumps to 1e30 at step 50, the loss is 0 from step 51
    and the member stays "ok"; eta 50: its loss rises past 10 x L(theta_0) at step 1 and comes back
    (diverged on the path, a fine final loss). K = 60, slope window (0.2, 1): k in [12, 60]."""
    from mhjax.train.loop import run

    config = tiny_mixture_config(heads=(1,), num_train=(16,), step_size=(0.25, 0.5, 50.0))
    config.init.scheme = "random_decoders"
    with config.train.unlocked():
        config.train.update(
            dict(steps=60, chunk_steps=30, eval_every=0, checkpoint_every=60, loss_points=20, divergence_factor=10.0)
        )
        config.train.step_rule = "t_jump_at_50_for_eta_half"
    with config.analysis.unlocked():
        config.analysis.slope_window = (0.2, 1.0)
    workdir = tmp_path_factory.mktemp("rates")
    payload = run(make_experiment(config), str(workdir), progress=False, log=lambda m: None)
    return workdir, {m["step_size"]: m for m in payload["members"]}


def test_no_rate_or_product_from_a_diverged_member_anywhere(rates_run):
    workdir, members = rates_run
    bad = members[50.0]
    assert bad["status"] == "diverged" and bad["loss_exceeded_at_step"] == 1, bad.get("diverged_reason")
    assert bad["train_loss"] < bad["initial_loss"]  # its final loss alone looks healthy
    for field in RATE_FIELDS:
        assert bad[field] is None, field
    assert bad["loss_slope_note"] == "the member diverged: no rate" and bad["loss_slope_window"] is None
    on_disk = {m["name"]: m for m in json.loads((workdir / "results.json").read_text())["members"]}
    assert all(on_disk[bad["name"]][field] is None for field in RATE_FIELDS)
    for table in ("results.md",):  # report.md's member table is the same markdown_table of the records
        lines = (workdir / table).read_text().splitlines()
        header = [c.strip() for c in lines[2].strip("|").split("|")]
        row = next(line for line in lines if line.startswith(f"| {bad['name']} |"))
        cells = dict(zip(header, [c.strip() for c in row.strip("|").split("|")]))
        assert all(cells[field] == "-" for field in ("loss_slope", "margin_loss_product", "loss_slope_stderr"))
    ok = members[0.25]
    assert ok["status"] == "ok" and all(isinstance(ok[f], float) for f in ("loss_slope", "margin_loss_product"))


def test_the_step_the_loss_reached_zero_is_recorded_and_no_slope_is_read_past_it(rates_run):
    """The first step whose loss is 0 equals the one in the per-step trace (every step kept), the
    slope is refused with a note naming it and the window, and the product is null, not 0.0."""
    workdir, members = rates_run
    zero = members[0.5]
    losses = trace.read(Workdir(workdir).trace_dir, zero["name"])
    first = int(losses["step"][np.flatnonzero(losses["loss"] <= LOSS_FLOOR)[0]])
    assert zero["status"] == "ok" and zero["loss_zero_at_step"] == first == 51
    assert zero["loss_slope"] is None and zero["loss_slope_stderr"] is None and zero["loss_slope_window"] is None
    assert zero["loss_slope_note"].startswith("L(theta_k) reached 0 (at or below float32's smallest normal) at k = 51")
    assert "inside the slope window [12, 60]" in zero["loss_slope_note"]
    assert zero["train_loss"] == 0.0 and zero["margin_loss_product"] is None
    assert members[0.25]["loss_zero_at_step"] is None
    summary = (workdir / "mixture_summary.md").read_text()
    assert f"- {zero['name']}: L(theta_k) reached 0" in summary  # named under "No slope for"


def test_the_slope_window_setting_and_the_standard_error(rates_run):
    """analysis.slope_window = (0.2, 1): the slope is the least-squares fit over the recorded k in
    [12, 60] exactly (scipy's linregress: slope and standard error), and the record says which k."""
    workdir, members = rates_run
    ok = members[0.25]
    steps, values = np.array(ok["loss_curve"]["steps"]), np.array(ok["loss_curve"]["values"], float)
    inside = (steps >= 12) & (steps <= 60)
    fit = stats.linregress(np.log(0.25 * steps[inside]), np.log(values[inside]))
    assert ok["loss_slope"] == pytest.approx(fit.slope, rel=1e-9)
    assert ok["loss_slope_stderr"] == pytest.approx(fit.stderr, rel=1e-6) and ok["loss_slope_stderr"] > 0
    assert ok["loss_slope_window"] == [int(steps[inside][0]), 60] and ok["loss_slope_points"] == int(inside.sum())
    summary = (workdir / "mixture_summary.md").read_text()
    assert "over the recorded k in [0.2 K, K] (analysis.slope_window = (0.2, 1))" in summary
    assert f"| {int(steps[inside][0])}-60 ({int(inside.sum())}) |" in summary


def test_fit_refuses_a_cut_or_thin_window():
    steps = np.array([0, 1, 2, 5, 10, 20, 50, 100, 200])
    values = 3.0 / np.maximum(steps, 1) ** 1.1
    fit = fit_loss_slope(steps, values, 200)  # [20, 200]: 20, 50, 100, 200
    assert fit["loss_slope"] == pytest.approx(-1.1, abs=1e-12) and fit["loss_slope_stderr"] < 1e-9
    assert fit["loss_slope_window"] == [20, 200] and fit["loss_slope_points"] == 4 and fit["loss_slope_note"] is None
    cut = values.copy()
    cut[-2:] = 0.0  # 0 from step 100 (the jump: it was fitted on what was left)
    fit = fit_loss_slope(steps, cut, 200)
    assert fit["loss_slope"] is None and "at k = 100, inside the slope window [20, 200]" in fit["loss_slope_note"]
    assert "no slope from 2 of its 4 recorded points" in fit["loss_slope_note"]
    assert "at k = 73," in fit_loss_slope(steps, cut, 200, zero_at=73)["loss_slope_note"]
    subnormal = values.copy()
    subnormal[-1] = 1e-40  # below float32's smallest normal: no log-rate there either
    assert fit_loss_slope(steps, subnormal, 200)["loss_slope"] is None
    thin = fit_loss_slope(steps, values, 200, window=(0.5, 1.0))  # 100, 200: two points
    assert thin["loss_slope"] is None and thin["loss_slope_note"].startswith("2 recorded points in the slope window")
    before = fit_loss_slope(steps, cut, 200, window=(0.0, 0.4))  # [1, 80]: before the loss reached 0
    assert before["loss_slope"] == pytest.approx(-1.1, abs=1e-12) and before["loss_slope_window"] == [1, 50]


def test_host_records_find_the_first_zero_step_at_any_step_and_keep_it_on_resume():
    """Only k = 0, 8 are recorded; the loss is 0 from step 5 (member 0) and never (member 1):
    zero_at_step is 5 from every row, and survives to_json / load_json; a curve saved before the
    field existed takes it from its recorded points."""
    records = HostRecords(["a", "b"], [0, 8])
    losses = np.array([[1.0, 1.0], [0.5, 0.5], [0.2, np.nan], [0.1, 0.3], [1e-39, 0.2], [0.0, 0.1]])
    records.record_losses([0, 1], losses[:3], 0)
    records.record_losses([0, 1], np.vstack([losses[3:], [[0.0, 0.1]] * 4]), 3)
    assert records.loss_curves[0] == {"steps": [0, 8], "values": [1.0, 0.0], "zero_at_step": 4}
    assert "zero_at_step" not in records.loss_curves[1]
    again = HostRecords(["a", "b"], [0, 8])
    again.load_json(json.loads(json.dumps(records.to_json())), 9)
    assert again.loss_curves == records.loss_curves
    old = {"loss_curves": {"a": {"steps": [0, 8], "values": [1.0, 0.0]}}}
    again.load_json(old, 9)
    assert again.loss_curves[0]["zero_at_step"] == 8


# ---------------------------------------------------------------------- #
# Item 11: the verdict in words
# ---------------------------------------------------------------------- #
def _record(h, slope, loss=1e-3, seed=0, **more):
    return dict(
        name=f"h{h}-s{seed}",
        num_train=32,
        step_size=0.1,
        heads=h,
        seed=seed,
        steps=100,
        loss_slope=slope,
        loss_slope_stderr=None if slope is None else 0.004,
        loss_slope_window=None if slope is None else [10, 100],
        loss_slope_points=0 if slope is None else 12,
        train_loss_eval=loss,
        **more,
    )


def test_the_verdict_names_the_h_that_meet_and_fail_and_says_what_was_computed():
    """The issue's eta0 = 0.1 case: H = 1 (-1.00) and 4 (-0.91) meet -0.8, 16 and 64 do not: the
    summary used to say 'for no H in the sweep'."""
    records = [_record(1, -1.0), _record(4, -0.91), _record(16, -0.75), _record(64, -0.70)]
    text = summary_markdown(records)
    line = next(x for x in text.splitlines() if x.startswith("- n=32, eta=0.1"))
    assert "met at H = 1 (-1.00), 4 (-0.91); not at H = 16 (-0.75), 64 (-0.70)" in line
    assert line.endswith("Smallest H from which every larger H meets it: none (H = 64 does not meet it).")
    records = [_record(1, -0.5), _record(4, -0.9, loss=4e-8), _record(8, None, loss=0.0), _record(16, -1.2)]
    records[2]["loss_slope_note"] = "L(theta_k) reached 0 at k = 51, inside the slope window [10, 100]"
    text = summary_markdown(records)
    line = next(x for x in text.splitlines() if x.startswith("- n=32, eta=0.1"))
    assert "met at H = 4 (-0.90*), 16 (-1.20); not at H = 1 (-0.50); no slope at H = 8." in line
    assert line.endswith("Smallest H from which every larger H meets it: H = 16.")
    assert "- h8-s0: L(theta_k) reached 0 at k = 51" in text
    assert "| 32 | 0.1 | 4 | 1 | -0.9 (s.e. 0.004) | 10-100 (12) | - | 4e-08 * | - |" in text
    assert "`*`: L(theta_K) < 1e-6 in a seed" in text


@pytest.mark.parametrize(
    "value, message",
    [
        ("0.3,1", None),
        ("0,0.5", None),
        ("0.5,0.2", "config.analysis.slope_window: must be two fractions (a, b) of K with 0 <= a < b <= 1"),
        ("0.1,1.5", "config.analysis.slope_window: must be two fractions"),
        ("0.5,", "config.analysis.slope_window: must be two fractions"),
    ],
)
def test_the_slope_window_is_a_setting_checked_in_one_line(value, message):
    config = load_config_file(os.path.join(ROOT, "configs", "mixture.py"))
    try:
        config = apply_overrides(config, {"analysis.slope_window": value}, override_defaults(config))
        make_experiment(config)
    except ConfigError as exc:
        assert message is not None and str(exc).startswith(message) and "\n" not in str(exc), str(exc)
        return
    assert message is None and config.analysis.slope_window == tuple(float(v) for v in value.split(","))


def test_the_rule_is_judged_at_the_members_own_step_sizes_and_under_jit():
    """A rule that is NaN above eta = 0.4 was refused by the probe at eta = 0.5 though the members
    use 0.1; it now trains. A rule with Python control flow on the step is one line, not a trace."""
    mhjax.register_mixture("step_rule", "t_nan_above_04", lambda c, e: jnp.where(e > 0.4, jnp.nan, e))
    mhjax.register_mixture("step_rule", "t_python_if", lambda c, e: e if c < 5 else 0.0)
    config = tiny_mixture_config(heads=(1,), num_train=(8,), step_size=(0.1,))
    config.train.step_rule = "t_nan_above_04"
    make_experiment(config)
    mixture_parts.check_step_rule("t_nan_above_04", [(0.1, 20)])
    with pytest.raises(ConfigError, match=r"^config\.train\.step_rule: step rule 't_nan_above_04' .* step size 0\.5;"):
        mixture_parts.check_step_rule("t_nan_above_04", [(0.1, 20), (0.5, 20)])
    with pytest.raises(ConfigError) as info:
        mixture_parts.check_step_rule("t_python_if", [(0.1, 20)])
    assert "failed when run on every step under jax.jit: TracerBoolConversionError" in str(info.value)
    assert "\n" not in str(info.value)
