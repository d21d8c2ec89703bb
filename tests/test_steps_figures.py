"""The report's figures over training steps (plotting/steps.py) from synthetic by-step entries: a
line is one swept configuration (task, task parameters, architecture, heads, learning rate), the
mean over its seeds only, never over configurations that share a head count."""

import numpy as np
import pytest

from mhjax.plotting import steps as steps_module


def entry(task, params, heads, seed, mixing, head_dim=None, lr=3e-3):
    return {
        "task": task,
        "task_params": params,
        "heads": heads,
        "seed": seed,
        "head_dim": head_dim,
        "learning_rate": lr,
        "loss": 1.0,
        "layers": [{"mixing_time_mean": mixing, "fidelity_pct_mean": 10 * mixing, "combined_beats_best_share": 0.5}],
    }


@pytest.fixture
def drawn(monkeypatch):
    """The figures plotting/steps.py finishes, kept open: [(figure, axes)]."""
    figures = []
    monkeypatch.setattr(steps_module, "_finish", lambda fig, axes, path: figures.append((fig, axes)))
    return figures


def lines_by_label(ax) -> dict:
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}


def test_a_task_parameter_gets_lines_of_its_own_not_the_mean_of_both(drawn):
    """k=1,2: the H=1 line of k=1 at step 300 is the mean of k=1's seeds (7.117), not of both ks."""
    mixing = {(1, 1): (7.0, 7.234), (2, 1): (7.1, 7.044), (1, 4): (3.0, 3.2), (2, 4): (2.0, 2.4)}
    by_step = {}
    for step, scale in (("0", 0.5), ("300", 1.0)):
        by_step[step] = {
            f"after_marker-k{k}-h{h}-s{s}": entry("after_marker", {"k": k}, h, s, scale * mixing[(k, h)][s])
            for (k, h) in mixing
            for s in (0, 1)
        }
    fields = ["task", "task_params", "heads", "seed"]
    assert steps_module.plot_mixing_fidelity_steps({"by_step": by_step}, "unused.png", fields)
    ((fig, axes),) = drawn
    lines = lines_by_label(axes[0][0])
    assert set(lines) == {
        f"{h} head{'s' if h > 1 else ''}, after_marker (k={k}) (mean of 2 seeds)" for k in (1, 2) for h in (1, 4)
    }
    xs, ys = lines["1 head, after_marker (k=1) (mean of 2 seeds)"]
    assert xs == [0, 300] and ys[1] == pytest.approx((7.0 + 7.234) / 2) and ys[0] == pytest.approx(0.5 * 7.117)
    xs, ys = lines["1 head, after_marker (k=2) (mean of 2 seeds)"]
    assert ys[1] == pytest.approx((7.1 + 7.044) / 2)
    # k=1 and k=2 with one head count: one colour, two styles
    k1, k2 = (
        next(l for l in axes[0][0].get_lines() if l.get_label().startswith(f"1 head, after_marker (k={k})"))
        for k in (1, 2)
    )
    assert k1.get_color() == k2.get_color() and (k1.get_linestyle(), k1.get_marker()) != (
        k2.get_linestyle(),
        k2.get_marker(),
    )


def test_four_architectures_are_four_lines_per_head_count(drawn):
    """The H=1 fidelity at step 200 of each head_dim is its own (1.929, 1.806, 0.614, 1.338), not their mean 1.42."""
    fidelity = {None: 1.929, 8: 1.806, 16: 0.614, 32: 1.338}
    by_step = {
        str(step): {
            f"copy-d{d}-h{h}-s0": entry("copy", {}, h, 0, (step / 200) * fidelity[d] / 10, head_dim=d)
            for d in fidelity
            for h in (1, 2)
        }
        for step in (100, 200)
    }
    assert steps_module.plot_mixing_fidelity_steps(
        {"by_step": by_step}, "unused.png", ["task", "head_dim", "heads", "seed"]
    )
    ((fig, axes),) = drawn
    lines = lines_by_label(axes[1][0])  # fidelity
    for d, value in fidelity.items():
        label = f"1 head, head_dim {'matched (width / H)' if d is None else d} (1 seed)"
        assert lines[label][1][-1] == pytest.approx(value), label
    assert len(lines) == 8
    order = [label for label in lines if label.startswith("1 head")]  # head_dim in order, matched (None) last
    assert [label.split("head_dim ")[1].split(" (")[0] for label in order] == ["8", "16", "32", "matched"]


def test_learning_rates_and_seeds_in_accuracy_over_steps(drawn):
    """steps_accuracy: a line per (heads, learning rate), each the mean over its two seeds."""
    members, curves = [], {}
    for lr in (1e-3, 3e-3):
        for s in (0, 1):
            name = f"copy-h2-lr{lr:g}-s{s}"
            members.append(dict(entry("copy", {}, 2, s, 1.0, lr=lr), name=name))
            curves[name] = {"eval/accuracy": (np.array([10, 20]), np.array([0.1 * s + lr * 100, 0.5]))}
    assert steps_module.plot_accuracy_steps(
        members, curves, "unused.png", sweep_fields=["task", "heads", "learning_rate", "seed"]
    )
    ((fig, axes),) = drawn
    lines = lines_by_label(axes[0])
    assert lines["2 heads, learning_rate 0.001 (mean of 2 seeds)"][1][0] == pytest.approx(100 * (0.05 + 0.1))
    assert lines["2 heads, learning_rate 0.003 (mean of 2 seeds)"][1][0] == pytest.approx(100 * (0.05 + 0.3))
