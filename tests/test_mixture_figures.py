"""The mixture's figures over step sizes from synthetic records (no training): report/curves.png
and path.png give each step size its own colour and line style with the legend in order, the head
count a marker; a diverged member is drawn marked and does not set the axes' range."""

import os

import numpy as np
import pytest
from matplotlib.figure import Figure

from mhjax.plotting import mixture_geometry
from mhjax.plotting.curves import line_styles, plot_curves
from mhjax.plotting.mixture_style import Style

ETAS = (0.01, 0.1, 1.0, 3.0, 10.0, 100.0)  # six: the four matplotlib styles repeated before
STEPS = np.array([0.0, 1, 2, 5, 10, 20, 50])


def records(diverged=None):
    out = []
    for eta in ETAS:
        for h in (1, 4):
            name = f"h{h}-s0-eta{eta:g}"
            status = "diverged" if name == diverged else "ok"
            out.append(dict(name=name, heads=h, seed=0, num_train=16, step_size=eta, ntk_margin=0.5, status=status))
    return out


@pytest.fixture
def saved(monkeypatch):
    figures = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: figures.append(self))
    return figures


def test_line_styles_are_all_different():
    styles = line_styles(20)
    assert len({str(s) for s in styles}) == 20 and styles[:4] == ["-", "--", ":", "-."]


def test_curves_give_each_step_size_a_colour_and_style_in_order_and_heads_a_marker(saved):
    members = records()
    curves = {m["name"]: {"train/loss": (STEPS, 1 / (1 + m["step_size"] * STEPS))} for m in members}
    assert plot_curves(members, curves, "unused.png", "step_size", ("loss",), coloured="step_size")
    (fig,) = saved
    looks = {}
    for line in fig.axes[0].get_lines():
        looks.setdefault((line.get_color(), str(line.get_linestyle())), set()).add(line.get_marker())
    assert len(looks) == len(ETAS) and all(markers == {"o", "s"} for markers in looks.values())
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert texts == [f"step_size {eta:g}" for eta in ETAS] + ["1 head", "4 heads"]


def test_a_diverged_member_is_drawn_marked_and_does_not_set_the_range(saved):
    members = records(diverged="h4-s0-eta100")
    curves = {m["name"]: {"eval/distance_from_init": (STEPS, 0.1 * STEPS * m["step_size"] ** 0.1)} for m in members}
    curves["h4-s0-eta100"] = {"eval/distance_from_init": (STEPS, 127_000 * STEPS)}
    assert plot_curves(members, curves, "unused.png", "step_size", (), coloured="step_size")
    (fig,) = saved
    ax = fig.axes[0]
    healthy_top = max(0.1 * 50 * eta**0.1 for eta in ETAS)
    assert healthy_top <= ax.get_ylim()[1] < 2 * healthy_top  # set by the healthy members
    (faint,) = [line for line in ax.get_lines() if line.get_alpha() is not None]
    assert max(faint.get_ydata()) == 127_000 * 50  # drawn whole, off the panel
    (cross,) = [line for line in ax.get_lines() if line.get_marker() == "x"]  # where it leaves the panel
    assert cross.get_color() == faint.get_color() and cross.get_ydata()[0] <= ax.get_ylim()[1]
    assert any("diverged" in t.get_text() for t in fig.legends[0].get_texts())


def test_path_gives_each_step_size_a_colour_and_style_in_order(monkeypatch):
    steps = np.array([0.0, 2, 5, 10, 20])
    monkeypatch.setattr(
        mixture_geometry, "member_curves", lambda workdir, name, tags: {t: (steps, 0.5 + steps) for t in tags}
    )
    fig = Figure()
    mixture_geometry.plot_path(fig, None, records(), Style("test", left_out=["h4-s0-eta100"]))
    fig.savefig(os.devnull, format="png")
    lines = fig.axes[2].get_lines()[:-1]  # the stability edge last
    looks = {(line.get_color(), str(line.get_linestyle())) for line in lines}
    assert len(looks) == len(ETAS) and {line.get_marker() for line in lines} == {"o", "s"}
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert texts == [f"eta={eta:g}" for eta in ETAS] + ["H=1", "H=4", "stability edge 2"]
    assert "1 diverged member(s) left out: h4-s0-eta100" in fig._suptitle.get_text()


def test_a_mixture_analysis_says_its_size_then_an_estimate_then_progress():
    """run.analyze(steps=...) on a mixture (experiments/mixture_access.AnalyzeProgress): the count
    before the first pair, an estimate after two (the first compiles), a line per tenth after."""
    from mhjax.experiments.mixture_access import AnalyzeProgress

    now, lines = [0.0], []
    progress = AnalyzeProgress(100, 4, lines.append, clock=lambda: now[0])
    assert lines == [
        "analyze: 100 (member, step) pairs (25 members x 4 steps), each an NTK Gram, its margin and the Hessian's "
        "extreme eigenvalues; an estimate follows the first two"
    ]
    for k in range(100):
        now[0] += 10.0 if k == 0 else 1.0  # the first pair compiles
        progress.done(step=k // 25)
    assert lines[1] == "analyze: about 109 s for the 100 pairs (the first 10.0 s with compiling, then 1.00 s each)"
    assert lines[2] == "analyze: 10/100 done (step 0), 19 s, about 90 s left"
    assert len(lines) == 2 + 10 and lines[-1] == "analyze: 100/100 done (step 3), 109 s, about 0 s left"
