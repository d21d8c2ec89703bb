"""Standard errors of held-out losses and the paired table of head counts (analysis/paired.py,
plotting/paired.py), on made-up per-window losses, against the rule written out here; MFU's
device peaks (models/mfu.py); the baselines drawn on the held-out curves; the closing line's throughput."""

import math

import numpy as np
import pytest

from mhjax.analysis import paired
from mhjax.models import mfu
from mhjax.plotting.curves import _baseline_lines
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


def test_seeds_with_their_own_windows_add_their_errors_and_their_spread():
    rng = np.random.default_rng(1)
    per_seed = [np.stack([rng.normal(d, 0.3, 40), np.ones(40)]) for d in (0.1, 0.3, 0.2)]
    got = paired.combine(per_seed, shared=False)
    means = [p[0].mean() for p in per_seed]
    ses = [p[0].std(ddof=1) / math.sqrt(40) for p in per_seed]
    se_windows = math.sqrt(sum(s * s for s in ses)) / 3
    se_seeds = np.std(means, ddof=1) / math.sqrt(3)
    assert got.mean == pytest.approx(np.mean(means)) and got.seeds == 3
    assert got.se == pytest.approx(math.hypot(se_windows, se_seeds))
    assert paired.combine(per_seed[:1], shared=True).se_seeds == 0.0  # one seed: the windows' noise only
    assert paired.verdict(0.05, 0.03) == "within noise" and paired.verdict(-0.07, 0.03) == "lower"
    assert paired.verdict(0.07, 0.03) == "higher"


def member(name, heads, seed, eval_set, **more):
    return {"name": name, "task": "copy", "heads": heads, "seed": seed, "eval_set": eval_set, **more}


def test_the_table_pairs_within_seeds_leaves_out_diverged_members_and_says_unpaired():
    rng = np.random.default_rng(2)
    base = {s: rng.normal(1.0, 0.2, 30) for s in (0, 1)}
    losses = {  # 4 heads: clearly below 1 head; 2 heads: the same up to noise
        ("h1", 0): base[0], ("h1", 1): base[1],
        ("h2", 0): base[0] + rng.normal(0, 0.01, 30), ("h2", 1): base[1] + rng.normal(0, 0.01, 30),
        ("h4", 0): base[0] - 0.3 + rng.normal(0, 0.05, 30), ("h4", 1): base[1] - 0.3 + rng.normal(0, 0.05, 30),
        ("h8", 0): base[0] - 5, ("h16", 1): base[1],
    }  # fmt: skip
    members = [member(f"copy-{h}-s{s}", int(h[1:]), s, f"set{s}") for h, s in losses]
    members[6]["status"] = "diverged"  # h8: its only member diverged, left out
    members[7]["eval_set"] = "other"  # h16 of seed 1 scored on other windows than h1 of seed 1: no pair
    sums = {m["name"]: np.stack([losses[m["name"].split("-")[1], m["seed"]], np.ones(30)]) for m in members}
    table = paired_tables(members, sums.get, ["task", "heads", "seed"])
    rows = {line.split(" | ")[0][2:]: line for line in table.splitlines() if line.startswith("| ")}
    assert "8" not in rows and "(held-out loss in nats)" in table
    assert "| 1 | 2 | " in rows["1"] and "| reference |" in rows["1"]
    assert rows["2"].endswith("| within noise |") and rows["4"].endswith("| lower |")
    assert "| unpaired |" in rows["16"]
    delta = [losses["h4", s] - losses["h1", s] for s in (0, 1)]  # each seed its own windows
    se = math.hypot(
        math.sqrt(sum((d.std(ddof=1) / math.sqrt(30)) ** 2 for d in delta)) / 2,
        np.std([d.mean() for d in delta], ddof=1) / math.sqrt(2),
    )
    assert f"| {np.mean(delta):+.4f} ± {se:.4f} |" in rows["4"]
    assert paired_tables(members, lambda name: None) == ""  # a workdir without per-window losses: no table


def test_mfu_uses_the_presets_matmul_peak_and_none_elsewhere():
    assert mfu.peak_flops("NVIDIA H200") == 494.7e12 and mfu.peak_flops("NVIDIA H200", "bfloat16") == 989.5e12
    assert mfu.peak_flops("NVIDIA H100 80GB HBM3") == 494.7e12  # the H100 SXM's datasheet rates
    assert mfu.peak_flops("cpu") is None and mfu.mfu(1e12, "cpu") is None
    assert mfu.mfu(98.94e12, "NVIDIA H200", devices=2) == pytest.approx(0.1)


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
