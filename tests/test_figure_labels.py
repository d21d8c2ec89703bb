"""accuracy_params.png's point labels (plotting/architecture.py): measured in the drawn figure's
pixels, no label covers another label or any point's marker, and each names its head count."""

import itertools

import numpy as np
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from mhjax.plotting.architecture import accuracy_vs_params_figure
from mhjax.plotting.style import pyplot


def arch_members():
    """Four architectures (head_dim matched, 8, 16, 32) x heads 1, 2, 4, 8 x 2 seeds at width 64:
    the matched members share one parameter count (head_dim 16 at H=4 too) and the accuracies lie
    within 3 points of each other, so naive labels overlap (they did: two of them)."""
    rng = np.random.default_rng(0)
    out = []
    for d in (None, 8, 16, 32):
        for h in (1, 2, 4, 8):
            attention = 4 * 64 * 64 if d is None else 4 * 64 * d * h
            for s in (0, 1):
                accuracy = 0.95 + 0.01 * rng.random() + 0.002 * h
                out.append(
                    dict(name=f"copy-d{d}-h{h}-s{s}", task="copy", heads=h, seed=s, head_dim=d, status="ok")
                    | dict(params=2 * 64 * 128 + 600 + attention, eval_accuracy=accuracy)
                )
    return out


def test_point_labels_cover_no_other_label_nor_any_marker():
    fig = accuracy_vs_params_figure(arch_members(), ["head_dim"])
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (ax,) = fig.axes
    notes = [t for t in ax.texts if t.get_text()]
    assert sorted(t.get_text() for t in notes) == sorted(f"H{h}" for h in (1, 2, 4, 8) for _ in range(4))
    boxes = [Text.get_window_extent(t, renderer) for t in notes]  # the text alone, not its leader line
    for a, b in itertools.combinations(boxes, 2):
        assert not a.overlaps(b), (a, b)
    half = 3 * fig.dpi / 72  # markers of 6 points
    for cx, cy in ax.transData.transform([t.xy for t in notes]):
        marker = Bbox.from_extents(cx - half, cy - half, cx + half, cy + half)
        assert not any(box.overlaps(marker) for box in boxes)
    pyplot().close(fig)
