"""Validation and test sets, and ``compare.tune`` (experiments/heldout_sets.py, data/heldout_split.py,
analysis/comparisons.py): a tiny text sweep over two learning rates selects, per head count, the
rate of the lowest mean validation loss and compares head counts on the disjoint test windows,
with intervals at least as wide as a t interval on the per-seed paired test differences and the
baseline note; generated tasks draw the two sets from distinct keys; a bad compare.tune is one line."""

import contextlib
import io
import json
import math
import os
import sys

import ml_collections
import numpy as np
import pytest
from scipy import stats

import mhjax
from mhjax import cli
from mhjax.analysis import comparisons
from mhjax.data import heldout_split
from mhjax.experiments import make_experiment
from mhjax.experiments.sequence_results import held_out
from mhjax.plotting.paired import render
from tests.conftest import config_source, tiny_sequence_config, tiny_train
from tests.errors_common import ROOT, assert_one_line_error

sys.path.insert(0, os.path.join(ROOT, "examples"))
from python_docs import python_docs  # noqa: E402


def tuned_text_config(path, **sweep):
    config = tiny_train(tiny_sequence_config(task=("text",), **sweep), 40, 40, 40, 40)
    with config.unlocked():
        config.model.update(seq_len=16, vocab_size=256, width=16, dropout=0.0)
        config.data.update(path=str(path), protocol="fresh", batch_size=8, num_eval=24)
        config.compare = ml_collections.ConfigDict({"tune": ("learning_rate",)})
        config.strategy = "auto"
    return config


@pytest.fixture(scope="module")  # ~16 s on 2 cores: the sweep of the "done when"
def tuned_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("tuned")
    path = base / "docs.txt"
    path.write_bytes(python_docs(48))
    config = tuned_text_config(path, heads=(1, 2), seed=(0, 1, 2), learning_rate=(1e-3, 1e-2))
    console = io.StringIO()
    with contextlib.redirect_stderr(console):
        run = mhjax.sweep(config, base / "w", progress=False)
    return run, console.getvalue()


@pytest.mark.slow
def test_a_tuned_text_sweep_selects_on_validation_and_reports_on_test(tuned_run):
    run, console = tuned_run
    results = json.load(open(os.path.join(run.workdir, "results.json")))
    members, folder = results["members"], os.path.join(run.workdir, "eval_windows")
    for m in members:
        assert {"val_loss", "val_loss_se", "val_bits_per_byte", "eval_loss", "val_set", "eval_set"} <= set(m)
        assert m["val_bits_per_byte"] == pytest.approx(m["val_loss"] / math.log(2))
    # the two sets' windows: disjoint tokens, in alternating blocks
    test, val = (np.load(os.path.join(folder, f"text{s}.starts.npy")) for s in ("", ".validation"))
    block = results["baselines"]["text"]["block_length"]
    span = lambda s: set((s[:, None] + np.arange(17)).ravel())  # noqa: E731
    assert not span(test) & span(val) and set(test // block % 2) == {1} and set(val // block % 2) == {0}
    found = {e["heads"]: e for e in results["comparisons"]}
    assert sorted(found) == [1, 2]
    sums = lambda name: np.load(os.path.join(folder, f"{name}.npy"))  # noqa: E731
    chosen = {}
    for heads, entry in found.items():
        mean_val = {
            lr: np.mean([m["val_loss"] for m in members if m["heads"] == heads and m["learning_rate"] == lr])
            for lr in (1e-3, 1e-2)
        }
        assert entry["selected"] == {"learning_rate": min(mean_val, key=mean_val.get)}  # argmin of mean val_loss
        chosen[heads] = {m["seed"]: m for m in members if m["heads"] == heads and m == m | entry["selected"]}
        assert entry["test_loss"] == pytest.approx(np.mean([m["eval_loss"] for m in chosen[heads].values()]), rel=1e-5)
    # the interval at least as wide as the t interval on the per-seed paired test differences
    d = [
        (sums(chosen[2][s]["name"])[0] - sums(chosen[1][s]["name"])[0]).sum() / sums(chosen[1][s]["name"])[1].sum()
        for s in (0, 1, 2)
    ]
    low, high = stats.t.interval(0.95, 2, loc=np.mean(d), scale=stats.sem(d))
    entry = found[2]
    assert entry["difference"] == pytest.approx(np.mean(d)) and entry["seeds"] == 3
    assert [p["difference"] for p in entry["per_seed_differences"]] == pytest.approx(d)
    assert entry["difference_interval"][0] <= low and entry["difference_interval"][1] >= high
    interval = entry["difference_interval"]
    verdict = "lower" if interval[1] < 0 else "higher" if interval[0] > 0 else "within noise"
    assert entry["verdict"] == verdict
    # the baseline note, where the members are above the trigram (a 40-step model is)
    trigram = results["baselines"]["text"]["trigram_bits"]
    above = any(e["test_loss"] / math.log(2) >= trigram for e in found.values())
    assert above == all(f"above the trigram ({trigram:.2f} bits/byte)" in e["note"] for e in found.values())
    # results.md, report.md and the console show the tuned table first
    for text in (open(os.path.join(run.workdir, "results.md")).read(), open(run.report()["md"]).read()):
        assert "## Head counts at their best settings: selected on validation, compared on test" in text
        assert "| selected learning_rate | validation loss (bits/byte) |" in text
    assert "selected on validation, compared on test" in console
    assert f"heads 2 learning_rate={entry['selected']['learning_rate']}: test" in console


def test_the_grid_edge_and_the_group_fields():
    members = [
        {"name": f"h{h}-lr{lr}-s{s}", "task": "copy", "heads": h, "learning_rate": lr, "seed": s, "val_loss": v}
        for h, lr, s, v in [(1, 0.1, 0, 2.0), (1, 0.1, 1, 2.2), (1, 0.3, 0, 1.0), (1, 0.3, 1, 3.3)]
        + [(2, 0.1, 0, 2.0), (2, 0.3, 0, 1.0), (2, 0.3, 1, None)]
    ]
    keys = comparisons.group_fields(["task", "heads", "seed", "learning_rate"], ("learning_rate",))
    assert keys == ("task",)
    groups = comparisons.cells(members, keys, ("learning_rate",))
    score = lambda i: members[i]["val_loss"]  # noqa: E731
    assert comparisons.select(groups[("copy",)][1], score) == (0.1,)  # mean 2.1 against 2.15
    assert comparisons.select(groups[("copy",)][2], score) == (0.1,)  # a seed unscored: never picked
    sums = {m["name"]: np.stack([np.full(4, m["val_loss"] or 1.0), np.ones(4)]) for m in members}
    found = comparisons.comparisons(members, sums.get, ["task", "heads", "seed", "learning_rate"], ("learning_rate",))
    assert all("lowest learning_rate tried: widen the grid" in e["note"] for e in found)
    table = render(found, members)  # the tuned table: the selection beside each head count, its note under it
    assert "| 2 | 1 | 0.1 | 2.0000 | 2.0000 | +0.0000 | +0.0000 | one seed |" in table
    assert "Note (every head count): lowest learning_rate tried: widen the grid." in table
    old = [{k: v for k, v in m.items() if k != "val_loss"} for m in members]  # written before validation sets
    found = comparisons.comparisons(old, sums.get, ["task", "heads", "seed", "learning_rate"])
    assert found and all("no validation set" in e["note"] for e in found)


def test_a_generated_task_draws_validation_and_test_from_distinct_keys():
    config = tiny_sequence_config(task=("copy",), heads=(1, 2), seed=(0, 1))
    experiment = make_experiment(config)
    a, b = (next(m for m in experiment.members if m["heads"] == h and m["seed"] == 0) for h in (1, 2))
    val, test = held_out(experiment, a, "validation"), held_out(experiment, a, "test")
    assert not np.array_equal(val.inputs, test.inputs)
    np.testing.assert_array_equal(val.inputs, held_out(experiment, b, "validation").inputs)  # paired in a seed
    other = next(m for m in experiment.members if m["seed"] == 1)
    assert not np.array_equal(val.inputs, held_out(experiment, other, "validation").inputs)


def test_the_held_out_blocks_alternate_and_windows_stay_inside():
    size, length = 1000, 8
    block = heldout_split.block_length(size, length)
    assert block == 16 * 9
    for part in (heldout_split.VALIDATION, heldout_split.TEST):
        starts = np.asarray(heldout_split.part_starts(np.array([0, 7], np.uint32), 500, size, length, part))
        assert set(starts // block % 2) == {part} and ((starts % block) + length + 1 <= block).all()
        assert (starts // block).max() < size // block  # whole blocks only: the tail is unused
    assert heldout_split.block_length(40, 8) == 20  # a short region: two blocks
    np.testing.assert_array_equal(heldout_split.window_clusters([0, 5, 30], 100, 4, (0, 10, 25), 900), [2, 2, 2])
    np.testing.assert_array_equal(heldout_split.window_clusters([0, 55], 100, 4), [0, 1])


@pytest.mark.parametrize(
    "tune,sweep,match",
    [
        (("heads",), {}, "config.compare.tune: 'heads' cannot be tuned"),
        (("seed",), {}, "config.compare.tune: 'seed' cannot be tuned"),
        (("width",), {"learning_rate": (1e-3, 3e-3)}, "'width' is not swept (config.sweep); allowed: "),
        (("learning_rate",), {}, "'learning_rate' has one value (0.003)"),
        ("learning_rate", {}, "config.compare.tune: a tuple of swept fields"),
    ],
)
def test_a_bad_compare_tune_is_one_line_exit_2(tmp_path, capsys, tune, sweep, match):
    config = tiny_sequence_config(**sweep)
    with config.unlocked():
        config.compare = ml_collections.ConfigDict({"tune": tune})
    path = tmp_path / "c.py"
    path.write_text(config_source(config))
    assert_one_line_error(capsys, cli.main(["train", "--config", str(path), "--workdir", str(tmp_path / "w")]), match)
    assert not os.path.exists(tmp_path / "w")


def test_expected_best_validation_loss_is_the_mean_minimum_over_every_draw():
    values = [3.0, 1.0, 2.5, 2.0]
    for n in (1, 2, 3):  # every ordered draw of n settings with replacement, equally likely
        draws = np.array(np.meshgrid(*[values] * n)).reshape(n, -1)
        assert comparisons.expected_best(values, n) == pytest.approx(draws.min(axis=0).mean())
    members = [
        {"name": f"{h}-{lr}-{s}", "task": "t", "heads": h, "learning_rate": lr, "seed": s, "val_loss": v + s}
        for h in (1, 2)
        for lr, v in zip((1, 2, 3), (3.0, 1.0, 2.0) if h == 1 else (1.5, 1.4, 1.6))
        for s in (0, 1)
    ]
    curves = comparisons.budget_curves(members, ["task", "heads", "seed", "learning_rate"], ("learning_rate",))
    assert curves[("t",)][1] == pytest.approx([comparisons.expected_best([3.5, 1.5, 2.5], n) for n in (1, 2, 3)])
    one, two = curves[("t",)][1], curves[("t",)][2]
    assert one[0] > two[0] and one[-1] < two[-1]  # the lines cross: the answer depends on the budget
