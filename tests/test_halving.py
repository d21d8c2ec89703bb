"""Successive halving inside the program (train/halving.py): the issue's tiny sweep (two head counts
x three learning rates x two seeds, one rung at half the steps, keep 1/3) against the same sweep
un-halved; a SIGTERM just after the rung, then resume; the decision rule on made-up losses; bad input."""

import json
import os
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest

import mhjax
from mhjax import cli
from mhjax.analysis.comparisons import STOPPED
from mhjax.config import ConfigError
from mhjax.experiments import make_experiment
from mhjax.io.checkpoint import SweepCheckpointer, member_key
from mhjax.io.sweep_state import sweep_status
from mhjax.io.workdir import Workdir
from mhjax.plotting.paired import console_lines
from mhjax.train import halving
from mhjax.workflows.analyze import analyze_workdir
from mhjax.workflows.sample import member_sample
from mhjax.workflows.train import describe
from tests.conftest import ROOT, config_source, tiny_sequence_config, tiny_train
from tests.errors_common import assert_one_line_error
from tests.tb_scalars import scalar_events

STEPS, RUNG = 8, 4
RATES = (1e-3, 3e-3, 1e-1)
# Survivors are trained in a program of 4 members instead of 12: float32 sums in another layout,
# so they equal the un-halved run's to round-off, not bit for bit (measured: < 1e-6 relative).
BOUND = 1e-5


def config(halve: bool = True, **halving_spec):
    c = tiny_train(tiny_sequence_config(heads=(1, 2), seed=(0, 1), learning_rate=RATES), STEPS, RUNG, RUNG, RUNG)
    with c.unlocked():
        c.compare = ml_collections.ConfigDict({"tune": ("learning_rate",)})
        if halve:
            c.train.halving = halving_spec or dict(rungs=(RUNG,), keep=1 / 3)
    return c


def results(workdir) -> dict:
    with open(os.path.join(workdir, "results.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):  # ~15 s on 2 cores: both sweeps
    root = tmp_path_factory.mktemp("halving")
    mhjax.sweep(config(), root / "halved", progress=False)
    mhjax.sweep(config(halve=False), root / "full", progress=False)
    return root, results(root / "halved"), results(root / "full")


@pytest.mark.slow  # the sweep twice (~20 s on 2 cores; the SIGTERM test ~20 s more)
def test_the_halved_sweep_trains_fewer_member_steps_and_its_survivors_equal_the_full_grid(runs):
    root, halved, full = runs
    # by hand: per head count 3 settings, floor(3 / 3) = 1 kept: 2 stopped x 2 seeds x 2 head counts
    # stop at 4; 4 survivors train 8 steps: 8 * 4 + 4 * 8 = 64 member-steps of 12 * 8 = 96
    assert halved["halving"]["member_steps"] == 64 and halved["halving"]["full_grid_member_steps"] == 96
    assert halved["halving"]["rungs"] == [RUNG] and halved["halving"]["keep"] == pytest.approx(1 / 3)
    by_name = {m["name"]: m for m in full["members"]}
    assert [m["name"] for m in halved["members"]] == [m["name"] for m in full["members"]]
    survivors = [m for m in halved["members"] if m["status"] != STOPPED]
    stopped = [m for m in halved["members"] if m["status"] == STOPPED]
    assert len(survivors) == 4 and len(stopped) == 8
    for m in survivors:
        other = by_name[m["name"]]
        assert m["steps"] == STEPS
        for field in ("eval_loss", "val_loss", "train_loss"):
            assert m[field] == pytest.approx(other[field], rel=BOUND), (m["name"], field)
    ranked = halving.read(str(root / "halved"))["decisions"][0]["val_loss"]  # every member's, at the rung
    for m in stopped:
        assert m["val_loss"] == ranked[m["name"]]
    for heads in (1, 2):  # each head count keeps the rate of the lowest mean validation loss at the rung
        at_rung = {}
        for lr in RATES:
            group = [m for m in halved["members"] if m["heads"] == heads and m["learning_rate"] == lr]
            assert len({m["status"] for m in group}) == 1  # a setting kept or stopped with all its seeds
            at_rung[lr] = np.mean([ranked[m["name"]] for m in group])
        kept = {m["learning_rate"] for m in survivors if m["heads"] == heads}
        assert kept == {min(at_rung, key=at_rung.get)}


@pytest.mark.slow
def test_stopped_members_keep_their_records_up_to_the_rung(runs):
    root, halved, _ = runs
    stopped = [m["name"] for m in halved["members"] if m["status"] == STOPPED]
    for m in halved["members"]:
        if m["status"] == STOPPED:
            assert m["stopped_at_step"] == RUNG and m["steps"] == RUNG and m["stopped_reason"]
    # TensorBoard: their points are the un-halved run's up to the rung (the same 12-member program), none after
    for name in stopped:
        mine, theirs = (scalar_events(os.path.join(root / w, "tb", name)) for w in ("halved", "full"))
        assert sorted(mine) <= sorted(theirs)
        for tag, points in mine.items():
            # train/loss at k: the loss of theta_k, which the step after k computes: known below the rung
            last = RUNG - 1 if tag.startswith("train/") else RUNG
            if tag.startswith(("train/", "eval/")):
                assert points == [(k, v) for k, v in theirs[tag] if k <= last], (name, tag)
    # their states at the rung (W/halving/4) are the un-halved run's checkpoint 4, bit for bit
    saved = SweepCheckpointer(str(root / "halved" / halving.FOLDER))
    other = SweepCheckpointer(str(root / "full" / "checkpoints"))
    try:
        mine, theirs = saved.restore_raw(RUNG)["members"], other.restore_raw(RUNG)["members"]
    finally:
        saved.close(), other.close()
    assert sorted(mine) == sorted(member_key(n) for n in stopped)
    for key, state in mine.items():
        jax.tree_util.tree_map(np.testing.assert_array_equal, state, theirs[key])


@pytest.mark.slow
def test_analyze_leaves_out_members_stopped_before_its_step(runs, tmp_path):
    root, halved, _ = runs
    lines = []
    analysis = analyze_workdir(root / "halved", out=tmp_path / "a", plot=False, tensorboard=False, log=lines.append)
    survivors = sorted(m["name"] for m in halved["members"] if m["status"] != STOPPED)
    assert sorted(analysis["members"]) == survivors
    assert any("stopped by halving" in line for line in lines)


@pytest.mark.slow
def test_the_tuned_comparison_selects_among_survivors_and_names_the_stopped(runs):
    _, halved, _ = runs
    status = {m["name"]: m["status"] for m in halved["members"]}
    for entry in halved["comparisons"]:
        chosen = [
            m
            for m in halved["members"]
            if m["heads"] == entry["heads"] and m["learning_rate"] == entry["selected"]["learning_rate"]
        ]
        assert all(m["status"] != STOPPED for m in chosen)
        named = entry["stopped_by_halving"]
        assert len(named) == 4 and all(status[n] == STOPPED for n in named)
    assert "  stopped by halving, not selected: 8 members (their entries: stopped_by_halving)" in console_lines(halved)


@pytest.mark.slow
@pytest.mark.parametrize(
    "signal_name, at, code, recorded",
    [
        # the second program's first chunk ends at the rung: the graceful stop falls at the rung's checkpoint
        ("SIGTERM", "chunk:2", 75, True),
        ("SIGKILL", "save:halving:4", -9, False),  # killed saving the stopped states: decided again, alike
        ("SIGKILL", "save:checkpoints:4", -9, True),  # decided, no checkpoint: resumed from 0, the recorded decision
    ],
)
def test_a_stop_at_the_rung_then_resume_gives_the_same_survivors_and_numbers(
    runs, tmp_path, signal_name, at, code, recorded
):
    _, halved, _ = runs
    path = tmp_path / "halving.py"
    path.write_text(config_source(config()))
    args = ["train", "--config", str(path), "--workdir", str(tmp_path / "w"), "--no-progress"]
    env = dict(os.environ, PYTHONPATH=ROOT, MHJAX_TEST_SIGNAL=signal_name, MHJAX_TEST_AT=at)
    driver = os.path.join(ROOT, "tests", "signal_driver.py")
    proc = subprocess.run([sys.executable, driver, *args], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == code, proc.stderr[-3000:]
    assert bool(halving.read(str(tmp_path / "w")).get("decisions")) == recorded
    assert cli.main(args) == 0
    again = results(tmp_path / "w")
    assert again["halving"] == halved["halving"]
    for a, b in zip(again["members"], halved["members"]):
        assert a["name"] == b["name"] and a["status"] == b["status"]
        assert a["eval_loss"] == b["eval_loss"] and a["val_loss"] == b["val_loss"]


def test_a_tiny_halved_sweep_shrinks_to_its_survivor(tmp_path):  # the default suite's run (~5 s)
    c = tiny_train(tiny_sequence_config(heads=(1,), seed=(0,), learning_rate=(1e-3, 1e-1)), 4, 2, 2, 2)
    with c.unlocked():
        c.compare = ml_collections.ConfigDict({"tune": ("learning_rate",)})
        c.train.halving = dict(rungs=(2,), reduction_factor=2)
    mhjax.sweep(c, tmp_path / "w", progress=False)
    got = results(tmp_path / "w")
    assert got["halving"]["member_steps"] == 2 + 4 and got["halving"]["full_grid_member_steps"] == 8
    ranked = halving.read(str(tmp_path / "w"))["decisions"][0]["val_loss"]
    best = min(ranked, key=ranked.get)
    assert [(m["name"], m["status"], m["steps"]) for m in got["members"]] == [
        (n, "ok" if n == best else STOPPED, 4 if n == best else 2) for n in ranked
    ]
    assert got["programs"] == {next(iter(got["programs"])): [best]}  # the last program: the survivor's alone
    rows = {r["name"]: r for r in sweep_status(tmp_path / "w")["members"]}  # mhjax status
    assert {n: (r["state"], r["step"]) for n, r in rows.items()} == {
        n: ("done", 4) if n == best else (STOPPED, 2) for n in ranked
    }
    # a stopped member is read at its rung (W/halving/2), by step or as the latest: params, sample
    (stopped,) = [n for n in ranked if n != best]
    saved = SweepCheckpointer(str(tmp_path / "w" / halving.FOLDER), keep=None)
    try:
        at_rung = saved.restore_raw(2)["members"][member_key(stopped)]["params"]
    finally:
        saved.close()
    files = Workdir.of(tmp_path / "w")
    for step in (None, 2, 4):
        assert jax.tree.all(jax.tree.map(np.array_equal, files.params(stopped, step), at_rung))
    assert member_sample(tmp_path / "w", stopped, [1, 2], tokens=2).step == 2


def test_dry_run_says_the_rungs_predicted_member_steps_and_the_survivors_programs():
    text = describe(make_experiment(config()), "cpu")
    # 12 members x 4 steps, then 1 of 3 learning rates x 2 seeds x 2 head counts x 4 steps
    assert "halving: rungs at steps 4, keep 0.333" in text and "predicted 64 member-steps of the full grid's 96" in text
    assert "after step 4: 4 members in 2 program(s)" in text


def test_shards_and_growing_are_refused_in_one_line(tmp_path, capsys):
    path = tmp_path / "c.py"
    path.write_text(config_source(config()))
    args = ["train", "--config", str(path), "--workdir", str(tmp_path / "w"), "--no-progress"]
    assert_one_line_error(capsys, cli.main([*args, "--shard", "0/2"]), "--shard: not with config.train.halving")
    # growing: a workdir of the sweep with fewer learning rates (written, not trained), then more
    small = config()
    with small.unlocked():
        small.sweep.learning_rate = RATES[:2]
    path.write_text(config_source(small))
    experiment = make_experiment(small)
    Workdir.of(tmp_path / "w").check_or_write_metadata(
        small.to_dict(), experiment.kind, experiment.metadata(), experiment.cannot_extend, experiment.config_defaults
    )
    capsys.readouterr()
    path.write_text(config_source(config()))
    assert_one_line_error(capsys, cli.main(args), "cannot grow")


def test_the_rule_keeps_the_best_fraction_per_head_count_and_stops_diverged_settings():
    records = []
    for heads in (1, 2):
        for lr, val in ((1, 3.0), (2, 2.0), (3, 1.0), (4, float("nan"))):
            for seed in (0, 1):
                records.append(
                    dict(name=f"h{heads}-lr{lr}-s{seed}", heads=heads, seed=seed, learning_rate=lr, val_loss=val + seed)
                )
    records[0]["status"] = "diverged"  # h1 lr1 s0: its setting stops
    decision = halving.decide(records, ["heads", "seed", "learning_rate"], ("learning_rate",), 0.5)
    # 4 settings, keep floor(4 * 0.5) = 2 of the scored ones: lr 3 and lr 2 at both head counts
    assert decision["kept"] == [f"h{h}-lr{lr}-s{s}" for h in (1, 2) for lr in (2, 3) for s in (0, 1)]
    assert "diverged" in decision["stopped"]["h1-lr1-s0"] and "diverged" in decision["stopped"]["h2-lr4-s1"]
    assert "ranked 3 of 4" in decision["stopped"]["h2-lr1-s0"]
    assert [halving.kept_count(n, 1 / 3) for n in (1, 2, 3, 4, 6, 9)] == [1, 1, 1, 1, 2, 3]


@pytest.mark.parametrize(
    "spec, match",
    [
        (dict(rungs=(4, 4)), "strictly increasing"),
        (dict(rungs=(8,)), "halving.rungs"),
        (dict(rungs=(2,)), "multiple of train.chunk_steps"),
        (dict(rungs=(4,), keep=1.0), "halving.keep"),
        (dict(rungs=(4,), reduction_factor=1), "reduction_factor"),
        (dict(rungs=(4,), grace=2), "unknown field"),
    ],
)
def test_bad_halving_is_one_line_exit_2(spec, match, tmp_path, capsys):
    path = tmp_path / "c.py"
    path.write_text(config_source(config(**spec)))
    code = cli.main(["train", "--config", str(path), "--workdir", str(tmp_path / "w"), "--no-progress"])
    assert_one_line_error(capsys, code, match)
    assert not os.path.exists(tmp_path / "w" / "results.json")


def test_halving_needs_compare_tune_and_reduction_factor_is_one_over_keep():
    c = config(rungs=(4,), reduction_factor=3)
    assert halving.spec_of(c)["keep"] == pytest.approx(1 / 3)
    with c.unlocked():
        c.compare.tune = ()
    with pytest.raises(ConfigError, match="needs config.compare.tune"):
        halving.spec_of(c)
