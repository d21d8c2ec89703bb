"""Report figures of a sweep over architecture axes (plotting/architecture.py): heads on the x-axis,
a line per value of one axis, a panel per value of a second; accuracy against parameters."""

import os

import matplotlib.image
import pytest

import mhjax
from mhjax.plotting.architecture import architecture_axes, architecture_figures, plot_against_heads
from tests.conftest import tiny_sequence_config, tiny_train


def synthetic(head_dims=(8, 16), widths=(32,)):
    members, entries = [], {}
    for width in widths:
        for d in head_dims:
            for h in (1, 4, 16):
                for seed in (0, 1):
                    name = f"copy-w{width}-d{d}-h{h}-s{seed}"
                    acc = 0.5 + 0.01 * h + (0.1 if d == 16 else 0) + 0.001 * seed
                    params = 1000 * width + 3 * width * h * d
                    members.append(dict(name=name, task="copy", width=width, head_dim=d, heads=h, seed=seed))
                    members[-1].update(eval_accuracy=acc, params=params, status="ok")
                    layer = {"fidelity_pct_mean": 40.0 + h, "combined_beats_best_share": 0.1 * (h > 1)}
                    entries[name] = {**members[-1], "accuracy": acc, "layers": [layer, dict(layer)]}
    return members, {"step": 4, "members": entries}


def test_figures_take_heads_on_x_a_line_per_head_dim_and_a_panel_per_width(tmp_path):
    members, analysis = synthetic(widths=(32, 64))
    fields = ["task", "width", "head_dim", "heads", "seed"]
    assert architecture_axes(members, fields) == ["width", "head_dim"]
    assert architecture_axes(members, ["task", "head_dim", "width", "heads"]) == ["head_dim", "width"]
    assert architecture_figures(members, analysis, ["task", "heads", "seed"]) == []  # no architecture axis
    figures = architecture_figures(members, analysis, ["task", "head_dim", "width", "heads", "seed"])
    assert [f[0] for f in figures] == [
        "arch_accuracy.png",
        "arch_fidelity.png",
        "arch_synergy.png",
        "accuracy_params.png",
    ]
    assert "one line per head_dim, one panel per width" in figures[0][3]
    for name, fn, args, _ in figures:
        assert fn(*args, str(tmp_path / name)) is True, name
    one, _ = synthetic()
    assert plot_against_heads(one, ["head_dim"], figures[0][2][2], "accuracy", str(tmp_path / "one.png"))
    wide, narrow = (matplotlib.image.imread(str(tmp_path / n)).shape for n in ("arch_accuracy.png", "one.png"))
    assert wide[1] > 1.6 * narrow[1]  # two panels (width 32, 64) beside each other, one without the axis
    # without an analysis: accuracy figures only; fidelity and synergy draw nothing
    figures = architecture_figures(members, None, ["task", "head_dim", "width", "heads"])
    assert [f[1](*f[2], str(tmp_path / ("x" + f[0]))) for f in figures] == [True, False, False, True]


# ~22 s: the synthetic test draws the same figures; test_architecture_outputs runs the report
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_the_report_of_a_heads_by_head_dim_sweep_embeds_the_architecture_figures(tmp_path):
    config = tiny_train(tiny_sequence_config(heads=(1, 2), head_dim=(8, 16)), 2, 2, 0, 2)
    run = mhjax.sweep(config, tmp_path / "w", progress=False)
    run.analyze(num_sequences=2, plot=False, tensorboard=False)
    result = run.report()
    text = open(result["md"]).read()
    assert "## Heads across architecture axes" in text
    for name in ("arch_accuracy.png", "arch_fidelity.png", "arch_synergy.png", "accuracy_params.png"):
        assert f"(report/{name})" in text and os.path.exists(tmp_path / "w" / "report" / name), name
    assert "one line per head_dim" in text
