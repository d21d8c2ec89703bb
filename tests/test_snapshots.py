"""Snapshots (config.train.snapshot_steps, train/snapshots.py): every member's parameters at the
chosen steps, kept for good under W/snapshots/<step>/; the pieces that cut the first chunk at
early snapshot steps change no number."""

import jax
import numpy as np
import pytest

from mhjax.config import ConfigError
from mhjax.experiments import make_experiment
from mhjax.io.workdir import Workdir
from mhjax.train import snapshots
from mhjax.train.loop import Sweep, run
from tests.conftest import set_field, tiny_sequence_config, tiny_train

STEPS = [0, 1, 3, 9]  # "log:4" over 9 steps in chunks of 3: 1 a piece, 3 and 9 chunk ends


def config(snapshot_steps=None):
    c = tiny_train(tiny_sequence_config(heads=(1, 2)), 9, 3, 3, 6)
    if snapshot_steps is not None:
        set_field(c, "train.snapshot_steps", snapshot_steps)
    return c


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"snapshots": a run with snapshot_steps="log:4" (0, 1, 3, 9: the first chunk cut), "later": the
    same at steps 4 and 7 (later chunks cut)}: Workdirs."""
    out = {}
    for name, steps in (("snapshots", "log:4"), ("later", (4, 7))):
        workdir = tmp_path_factory.mktemp(name) / "w"
        c = config(steps)
        if name == "later":  # evaluations every 2 and checkpoints every 4 steps: both crossed at the cut at 4
            c.train.update(dict(eval_every=2, checkpoint_every=4))
        run(make_experiment(c), str(workdir), progress=False, log=lambda m: None)
        out[name] = Workdir(workdir)
    return out


def leaves(tree):
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def assert_equal_trees(a, b):
    x, y = leaves(a), leaves(b)
    assert sorted(x) == sorted(y)
    for key in x:
        assert x[key].dtype == y[key].dtype and np.array_equal(x[key], y[key], equal_nan=True), key


def test_log_and_lin_steps_are_step_0_and_spaced_up_to_the_last_exactly():
    assert snapshots.resolve("log:4", 9) == tuple(STEPS)
    assert snapshots.resolve("log:4", 200) == (0, 1, 14, 200)  # configs/quick.py
    paper = snapshots.resolve("log:8", 20000)  # configs/paper.py: no longer rounded to chunk ends
    assert paper == (0, 1, 5, 27, 141, 737, 3839, 20000)
    assert snapshots.resolve("lin:6", 300) == (0, 60, 120, 180, 240, 300)
    assert snapshots.resolve("lin:4", 10) == (0, 3, 7, 10)  # rounded to whole steps
    assert snapshots.resolve("lin:20", 3) == (0, 1, 2, 3)  # fewer where steps coincide
    assert snapshots.resolve((0, 150, 1000), 1000) == (0, 150, 1000)
    assert snapshots.resolve((0, 15, 27), 30) == (0, 15, 27)  # any step, not only chunk ends
    assert snapshots.resolve("0,10,30", 30) == (0, 10, 30)  # as typed on the command line
    assert snapshots.resolve(("log:2",), 30) == (0, 30)  # "log:N" over a tuple in the file
    assert snapshots.resolve(None, 30) == snapshots.resolve((), 30) == snapshots.resolve("()", 30) == ()


@pytest.mark.parametrize(
    "value, words",
    [
        ("log:1", 'config.train.snapshot_steps: "log:N" needs an integer N >= 2'),
        ("log:x", 'config.train.snapshot_steps: "log:N" needs an integer N >= 2'),
        ("lin:1", 'config.train.snapshot_steps: "lin:N" needs an integer N >= 2'),
        ("often", 'config.train.snapshot_steps: must be a tuple of steps in [0, train.steps], "log:N" or "lin:N"'),
        ((0, 31), "config.train.snapshot_steps: each step must be an integer in [0, train.steps=30]; got 31"),
        ((True,), "config.train.snapshot_steps: each step must be an integer"),
    ],
)
def test_bad_snapshot_steps_are_one_line_errors_naming_the_field(value, words):
    with pytest.raises(ConfigError) as exc:
        snapshots.resolve(value, 30)
    assert str(exc.value).startswith(words) and "\n" not in str(exc.value)
    c = tiny_train(tiny_sequence_config(), 30, 10, 10, 10)
    set_field(c, "train.snapshot_steps", value)
    with pytest.raises(ConfigError, match="config.train.snapshot_steps"):
        make_experiment(c)  # validated with the config, before anything compiles


def test_every_members_parameters_are_kept_at_each_snapshot_step(runs):
    w = runs["snapshots"]
    assert w.snapshot_steps() == STEPS and w.checkpoint_steps() == [6, 9]
    names = w.member_names()
    sweep = Sweep(make_experiment(config("log:4")))
    initial = sweep.member_states(sweep.init_states())
    store = w.snapshotter()
    stored = store.restore_raw(9)["members"]  # the snapshot itself (params() reads the checkpoint at 9)
    store.close()
    for name in names:
        assert_equal_trees(w.params(name, 0), initial[name].params)
        assert_equal_trees(stored[name]["params"], w.member_states(9)[name]["params"])  # the checkpoint at 9
        # the parameters move between snapshots: 1 and 3 are other states
        assert not np.array_equal(*(next(iter(leaves(w.params(name, s)).values())) for s in (1, 3)))
        assert set(w.member_states(1)[name]) == {"params"}  # parameters only, no optimizer state


@pytest.fixture(scope="module")
def uncut():
    """{step: every member's state} of the sweep trained in whole chunks of 3 (the last of 1) and
    no I/O, to steps 4 and 9: what runs cut into pieces must equal."""
    sweep = Sweep(make_experiment(config()))
    return {steps: sweep.member_states(sweep.train(sweep.init_states(), steps, 3)) for steps in (4, 9)}


def test_cutting_the_first_chunk_at_snapshot_steps_changes_no_number(runs, uncut):
    """The pieces program runs steps 0-1 and 1-3 here; the uncut run one chunk 0-3: bit-identical."""
    for name, state in runs["snapshots"].member_states(9).items():
        assert_equal_trees(comparable(state), comparable(uncut[9][name]))


def test_snapshots_at_steps_inside_later_chunks_are_exact_and_change_no_number(runs, uncut):
    """Steps 4 and 7 cut the chunks 3-6 and 6-9 (chunks of 3) into pieces of one program: the
    final state equals the uncut run's bit for bit, the snapshot at 4 is the parameters of the
    same sweep trained to step 4 and stopped, and evaluations and checkpoints stay at chunk ends."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    w = runs["later"]
    assert w.snapshot_steps() == [4, 7]
    # evaluations and checkpoints where a run without snapshots has them: at step 0 and the chunk
    # ends 3, 6, 9 (crossing 2, 4, 6 and 8), not at the cuts 4 and 7
    assert w.checkpoint_steps() == [6, 9]
    events = EventAccumulator(w.run_dir(w.member_names()[0]), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("eval/loss")] == [0, 3, 6, 9]  # 0: every sequence run's first
    for name, state in w.member_states(9).items():
        assert_equal_trees(comparable(state), comparable(uncut[9][name]))
        assert_equal_trees(w.params(name, 4), uncut[4][name].params)
        assert not np.array_equal(*(next(iter(leaves(w.params(name, s)).values())) for s in (4, 7)))


def comparable(state):
    """The parameters and loss-path values of a state (a checkpoint's dict or a MemberState)."""
    fields = ("params", "last_loss", "initial_loss", "max_loss", "step")
    return {k: state[k] if isinstance(state, dict) else getattr(state, k) for k in fields}


def test_the_disk_line_is_parameter_bytes_times_members_times_snapshots():
    experiment = make_experiment(config("log:4"))
    sweep = Sweep(experiment)
    each = sum(
        x.size * x.dtype.itemsize
        for x in jax.tree_util.tree_leaves(sweep.member_states(sweep.init_states())["copy-h1-s0"].params)
    )
    assert snapshots.params_bytes(sweep) == each
    line = snapshots.disk_line(sweep, snapshots.steps_of(experiment.config))
    total = each * 2 * 4
    assert line.startswith("snapshots: 4 (steps 0, 1, 3, 9) x 2 members x ") and f"{total / 2**10:,.1f} KiB" in line


def test_forward_and_params_at_a_snapshot_or_kept_checkpoint_step(runs):
    import mhjax

    run = mhjax.load(runs["snapshots"].path)
    assert run.snapshot_steps == STEPS and run.checkpoint_steps == [6, 9]
    tokens = np.random.default_rng(0).integers(0, 16, (3, 8))
    for name in run.member_names:
        for step in (1, 6, None):
            got = run.forward(name, tokens, step=step)
            want = run.model(name)(run.params(name, step=step), tokens)
            # the same parameters (two programs: equal to float rounding, as in test_forward)
            np.testing.assert_allclose(np.asarray(want), got.logits, rtol=1e-6, atol=1e-6)
        before, after = run.forward(name, tokens, step=0), run.forward(name, tokens, step=9)
        assert not np.array_equal(before.logits, after.logits)
    for bad in (2, 10, "last"):
        with pytest.raises(ConfigError) as exc:
            run.forward(run.member_names[0], tokens, step=bad)
        assert str(exc.value) == (
            f"step: no checkpoint or snapshot at step {bad} in {run.workdir} (kept: 0, 1, 3, 6, 9)"
        )
        with pytest.raises(ConfigError, match="kept: 0, 1, 3, 6, 9"):
            run.params(run.member_names[0], step=bad)


def test_analyze_at_snapshot_steps_keeps_the_latest_layout_and_every_step(runs, capsys, monkeypatch):
    import json
    import os

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from mhjax.cli import main as cli
    from mhjax.workflows import analyze as analyze_module
    from tests.errors_common import assert_one_line_error

    w = runs["snapshots"]
    argv = ["analyze", "--workdir", w.path, "--num-sequences", "3", "--no-plot"]
    assert cli([*argv, "--steps", "all"]) == 0, capsys.readouterr().err
    assert "steps analysed: 0, 1, 3, 9" in capsys.readouterr().out
    # the report's figures over steps, one line per head count
    assert cli(["report", "--workdir", w.path]) == 0, capsys.readouterr().err
    report = open(w.report_path).read()
    assert "## Heads along training" in report and "for `copy-h2-s0`" in report
    for figure in ("steps_mixing_fidelity", "steps_synergy", "steps_head_importance", "steps_accuracy"):
        assert f"({os.path.basename(w.report_dir)}/{figure}.png)" in report, figure
        assert os.path.getsize(os.path.join(w.report_dir, f"{figure}.png")) > 1000
    data = json.loads(open(w.analysis_path).read())
    assert list(data["by_step"]) == ["0", "1", "3", "9"] and data["step"] == 9  # the snapshots and the latest
    assert data["members"] == data["by_step"]["9"]
    for members in data["by_step"].values():
        assert sorted(members) == w.member_names()
        for entry in members.values():
            assert len(entry["layers"][0]["head_weights"]) == entry["heads"] and entry["status"] == "ok"
    accuracy = [data["by_step"][s]["copy-h2-s0"]["layers"][0]["fidelity_pct_mean"] for s in data["by_step"]]
    assert len(set(accuracy)) > 1  # other parameters at each step
    for name in w.member_names():  # TensorBoard: each scalar at its own step, a curve
        events = EventAccumulator(w.run_dir(name), size_guidance={"scalars": 0})
        events.Reload()
        assert [e.step for e in events.Scalars("analysis/layer0/mixing_time")] == [0, 1, 3, 9]
        # per-head ablation over the steps analysed (the importance figure's curves, every member)
        for head in range(data["members"][name]["heads"]):
            got = [e.value for e in events.Scalars(f"analysis/layer0/head{head}/loss_without")]
            want = [data["by_step"][s][name]["layers"][0]["ablation"]["loss_without"][head] for s in data["by_step"]]
            assert np.allclose(got, want, rtol=1e-6), (name, head)
    # the importance figure pointed at another member; one without ablation at two steps refused
    assert cli(["report", "--workdir", w.path, "--importance-member", "copy-h1-s0"]) == 0
    assert "for `copy-h1-s0`" in open(w.report_path).read()
    capsys.readouterr()
    line = assert_one_line_error(
        capsys, cli(["report", "--workdir", w.path, "--importance-member", "nope"]), "--importance-member"
    )
    assert "copy-h2-s0, copy-h1-s0" in line
    # a step analysed with equal options is kept; a new one is computed alone
    calls = []
    original = analyze_module.analyze_params
    monkeypatch.setattr(analyze_module, "analyze_params", lambda *a, **k: calls.append(1) or original(*a, **k))
    assert cli([*argv, "--steps", "1,6,last"]) == 0
    assert len(calls) == 2  # step 6, two members
    data = json.loads(open(w.analysis_path).read())
    assert list(data["by_step"]) == ["0", "1", "3", "6", "9"] and data["step"] == 9
    # other options: computed again, earlier steps of other options dropped
    argv[4] = "4"  # --num-sequences
    assert cli([*argv, "--steps", "3"]) == 0
    data = json.loads(open(w.analysis_path).read())
    assert list(data["by_step"]) == ["3"] and data["step"] == 3 and len(calls) == 2 + 2
    capsys.readouterr()
    for bad in ("2", "x", "1.5", ""):
        line = assert_one_line_error(capsys, cli([*argv, "--steps", bad]), "--steps")
        assert "kept: 0, 1, 3, 6, 9" in line


# ~16 s: the snapshot code is the sequence tests'; test_mixture_plugins reads a mixture's params at steps
@pytest.mark.slow
def test_a_mixture_run_gives_the_ntk_margin_at_its_snapshot_steps(tmp_path):
    """run.ntk(m, step) and run.analyze(steps="all") read snapshots; the margin along training
    is a figure with one line per head count (W/ntk_margin_steps.png, shown by the report)."""
    import mhjax
    from tests.test_mixture_sweep import tiny_mixture_config

    config = tiny_mixture_config(heads=(1, 2), num_train=(8,))
    with config.train.unlocked():
        config.train.update(dict(steps=20, chunk_steps=5, eval_every=10, checkpoint_every=10, snapshot_steps="log:5"))
    run = mhjax.sweep(config, tmp_path / "w", progress=False)
    assert run.snapshot_steps == [0, 1, 3, 7, 20]  # 1, 3 and 7 cut the first two chunks, 20 the end
    for name in run.member_names:
        margins = [run.ntk(name, step).margin for step in run.snapshot_steps[1:]]
        assert len(margins) == 4 and all(np.isfinite(m) for m in margins) and len(set(margins)) == 4
    records = run.analyze(steps="all")
    assert sorted({r["step"] for r in records}) == [0, 1, 3, 7, 20] and len(records) == 5 * len(run.member_names)
    for r in records:
        if r["step"] in (1, 3, 7):
            assert r["ntk_margin"] == pytest.approx(run.ntk(r["member"], r["step"]).margin, rel=1e-6)
    assert (tmp_path / "w" / "ntk_margin_steps.png").stat().st_size > 1000
    assert "ntk_margin_steps.png" in open(run.report()["md"]).read()


def test_the_command_line_sets_snapshot_steps_on_any_config_and_the_dry_run_prints_their_disk(tmp_path, capsys):
    from mhjax.cli import main as cli
    from tests.conftest import config_source
    from tests.errors_common import assert_one_line_error

    path = tmp_path / "tiny.py"
    path.write_text(config_source(config()))  # no snapshot_steps field
    assert cli(["train", "--config", str(path), "--dry-run", "--config.train.snapshot_steps=log:4"]) == 0
    out = capsys.readouterr().out
    assert "\nsnapshots: 4 (steps 0, 1, 3, 9) x 2 members x " in out and "on disk under W/snapshots/" in out
    assert cli(["train", "--config", str(path), "--dry-run", "--config.train.snapshot_steps=0,6"]) == 0
    assert "snapshots: 2 (steps 0, 6)" in capsys.readouterr().out
    assert cli(["train", "--config", str(path), "--dry-run", "--config.train.snapshot_steps=0,5"]) == 0
    assert "snapshots: 2 (steps 0, 5)" in capsys.readouterr().out
    code = cli(["train", "--config", str(path), "--dry-run", "--config.train.snapshot_steps=0,10"])
    assert_one_line_error(
        capsys, code, "config.train.snapshot_steps: each step must be an integer in [0, train.steps=9]"
    )
    code = cli(["train", "--config", str(path), "--dry-run", "--config.train.snapshot_steps=log:0"])
    assert_one_line_error(capsys, code, 'config.train.snapshot_steps: "log:N" needs an integer N >= 2')
