"""Standard errors of held-out losses and the paired table of head counts (analysis/paired.py,
plotting/paired.py), on made-up per-window losses, against the rule written out here; MFU's
device peaks (models/flops.py); the baselines drawn on the held-out curves; the closing line's throughput."""

import math

import numpy as np
import pytest
from scipy import stats

from mhjax.analysis import paired
from mhjax.models import flops
from mhjax.plotting.curves import _after_step_zero, _baseline_lines
from mhjax.plotting.paired import paired_tables
from mhjax.plotting.style import pyplot
from mhjax.train.console import throughput_text


def test_a_members_standard_error_is_the_ratio_estimators():
    rng = np.random.default_rng(0)
    loss = rng.normal(2.0, 0.5, 50)
    equal = np.stack([loss * 8, np.full(50, 8.0)])  # 8 weighted tokens a window
    mean, se = paired.mean_se(equal)
    assert mean == pytest.approx(loss.mean()) and se == pytest.approx(loss.std(ddof=1) / math.sqrt(50))
    weights = rng.integers(1, 9, 50).astype(float)  # a task weighting some positions only
    mean, se = paired.mean_se(np.stack([loss * weights, weights]))
    ratio = (loss * weights).sum() / weights.sum()
    residual = weights * (loss - ratio) / weights.mean()  # the linearised ratio, per window
    assert mean == pytest.approx(ratio) and se == pytest.approx(residual.std(ddof=1) / math.sqrt(50))


def test_a_clustered_standard_error_adds_the_windows_of_a_cluster_first():
    rng = np.random.default_rng(3)
    clusters = np.repeat([5, 1, 9, 2], [10, 3, 20, 7])  # ids in any order, clusters of any size
    loss = rng.normal(2.0, 0.5, 40) + np.repeat(rng.normal(0, 0.3, 4), [10, 3, 20, 7])
    mean, se = paired.mean_se(np.stack([loss, np.ones(40)]), clusters)
    resid = np.array([(loss[clusters == g] - loss.mean()).sum() for g in (5, 1, 9, 2)])
    assert mean == pytest.approx(loss.mean()) and se == pytest.approx(math.sqrt(4 / 3 * (resid**2).sum()) / 40)
    assert paired.mean_se(np.stack([loss, np.ones(40)]), np.zeros(40))[1] != paired.mean_se([loss, np.ones(40)])[1]
    assert math.isnan(paired.mean_se(np.stack([loss, np.ones(40)]), np.zeros(40))[1])  # one cluster: no SE


def test_t_quantiles_and_intervals_equal_scipys():
    for df in (1, 2, 4, 9, 30):
        assert paired.t_quantile(df) == pytest.approx(stats.t.ppf(0.975, df), rel=1e-9)
    rng = np.random.default_rng(1)
    per_seed = [np.stack([rng.normal(d, 0.3, 40), np.ones(40)]) for d in (0.1, 0.3, 0.2)]
    d = [p[0].mean() for p in per_seed]
    got = paired.compare(per_seed, shared=False)  # windows per seed: the t interval on the d_s
    low, high = stats.t.interval(0.95, 2, loc=np.mean(d), scale=stats.sem(d))
    assert got.interval == pytest.approx((low, high)) and got.per_seed == pytest.approx(d)
    assert paired.verdict(got.interval) == ("within noise" if low <= 0 <= high else "higher")
    shared = paired.compare(per_seed, shared=True)  # the same windows: their share added, never narrower
    assert shared.se == pytest.approx(
        math.hypot(stats.sem(d), np.mean([p[0] for p in per_seed], 0).std(ddof=1) / 40**0.5)
    )
    assert shared.interval[0] < low and shared.interval[1] > high and shared.clusters == 40
    one = paired.compare(per_seed[:1], shared=True)
    assert math.isnan(one.interval[0]) and paired.verdict(one.interval) == "one seed"
    assert paired.verdict((-0.3, -0.1)) == "lower" and paired.verdict((0.1, 0.2)) == "higher"
    assert paired.verdict((-0.1, 0.2)) == "within noise"


def member(name, heads, seed, eval_set, **more):
    return {"name": name, "task": "copy", "heads": heads, "seed": seed, "eval_set": eval_set, **more}


def test_the_table_pairs_within_seeds_leaves_out_diverged_members_and_says_unpaired():
    rng = np.random.default_rng(2)
    base = {s: rng.normal(1.0, 0.2, 30) for s in (0, 1, 2)}
    losses = {  # 4 heads: clearly below 1 head; 2 heads: the same up to noise
        **{("h1", s): base[s] for s in (0, 1, 2)},
        **{("h2", s): base[s] + rng.normal(0, 0.01, 30) for s in (0, 1, 2)},
        **{("h4", s): base[s] - 0.3 + rng.normal(0, 0.05, 30) for s in (0, 1, 2)},
        ("h8", 0): base[0] - 5, ("h16", 1): base[1],
    }  # fmt: skip
    members = [member(f"copy-{h}-s{s}", int(h[1:]), s, f"set{s}") for h, s in losses]
    members[9]["status"] = "diverged"  # h8: its only member diverged, left out
    members[10]["eval_set"] = "other"  # h16 of seed 1 scored on other windows than h1 of seed 1: no pair
    sums = {m["name"]: np.stack([losses[m["name"].split("-")[1], m["seed"]], np.ones(30)]) for m in members}
    table = paired_tables(members, sums.get, ["task", "heads", "seed"])
    rows = {line.split(" | ")[0][2:]: line for line in table.splitlines() if line.startswith("| ")}
    assert "8" not in rows and "**copy** (nats)" in table
    assert "| 1 | 3 | " in rows["1"] and "| reference |" in rows["1"]
    assert rows["2"].endswith("| within noise |") and rows["4"].endswith("| lower |")
    assert "| unpaired |" in rows["16"]
    d = [(losses["h4", s] - losses["h1", s]).mean() for s in (0, 1, 2)]  # each seed its own windows: t on d_s
    low, high = stats.t.interval(0.95, 2, loc=np.mean(d), scale=stats.sem(d))
    per_seed = ", ".join(f"{x:+.4f}" for x in d)
    assert f"| {np.mean(d):+.4f} [{low:+.4f}, {high:+.4f}] | {per_seed} | lower |" in rows["4"]
    assert "test loss (nats) ± SE" in table and "3 paired seed(s) here (t(2) = 4.30)" in table
    assert paired_tables(members, lambda name: None) == ""  # a workdir without per-window losses: no table


def test_mfu_uses_the_presets_matmul_peak_and_none_elsewhere():
    assert flops.peak_flops("NVIDIA H200") == 494.7e12 and flops.peak_flops("NVIDIA H200", "bfloat16") == 989.5e12
    assert flops.peak_flops("NVIDIA H100 80GB HBM3") == 494.7e12  # the H100 SXM's datasheet rates
    assert flops.peak_flops("cpu") is None and flops.mfu(1e12, "cpu") is None
    assert flops.mfu(98.94e12, "NVIDIA H200", devices=2) == pytest.approx(0.1)


def test_baselines_are_drawn_in_the_panels_unit():
    plt = pyplot()
    fig, ax = plt.subplots()
    baseline = {"unigram_bits": 4.0, "bigram_bits": 3.0, "trigram_bits": 2.0}
    _baseline_lines(ax, "eval/loss", baseline)  # nats
    assert sorted(line.get_ydata()[0] for line in ax.lines) == pytest.approx(
        [2 * math.log(2), 3 * math.log(2), 4 * math.log(2)]
    )
    ax.clear()
    _baseline_lines(ax, "eval/bits_per_byte", baseline)
    assert sorted(line.get_ydata()[0] for line in ax.lines) == pytest.approx([2.0, 3.0, 4.0])
    ax.clear()
    _baseline_lines(ax, "eval/accuracy", baseline)
    assert not ax.lines
    plt.close(fig)


def test_the_closing_line_gives_tokens_per_second_and_mfu():
    assert throughput_text({"member_steps_per_s": 2.0, "tokens_per_s": 16384.0, "mfu": 0.1234}) == (
        ", 16,384 tokens/s, MFU 12.3%"
    )
    assert throughput_text({"tokens_per_s": 10.0, "mfu": None}) == ", 10 tokens/s, MFU n/a (no peak for this device)"
    assert throughput_text({}) == ""  # an experiment without rates: the line as before


def test_a_loss_panel_spans_the_steps_after_step_0_and_says_where_step_0_went():
    plt = pyplot()
    fig, ax = plt.subplots()
    points = [
        (np.array([0.0, 100, 200]), np.array([8.0, 3.2, 3.0])),
        (np.array([0.0, 100, 200]), np.array([8.1, 3.3, 3.1])),
    ]
    baseline = {"unigram_bits": 4.5, "bigram_bits": 3.5, "trigram_bits": 2.8}
    low, high = _after_step_zero(ax, points, "eval/bits_per_byte", baseline, (0.0, 9.0))
    assert 2.6 < low < 2.8 and 3.3 < high < 3.4  # the trigram below the curves kept in, step 0 left out
    assert any("step 0: 8.1, above the panel" in t.get_text() for t in ax.texts)
    flat = [(np.array([0.0, 100]), np.array([3.0, 3.5]))]  # step 0 inside the later range: as it was
    assert _after_step_zero(ax, flat, "eval/loss", None, (2.0, 4.0)) == (2.0, 4.0)
    plt.close(fig)
