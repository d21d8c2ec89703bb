"""What every figure shares: pyplot on the file-only Agg backend, and one colour and label per head count."""

from __future__ import annotations


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display); imported on first use: it is slow."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def heads_colours(values) -> dict:
    """{value: colour} along viridis (to 0.85, where yellow is still visible), values sorted: numbers
    first in order, then the rest by name."""
    values = sorted(
        set(values), key=lambda v: (not isinstance(v, (int, float)), v if isinstance(v, (int, float)) else str(v))
    )
    cmap = pyplot().get_cmap("viridis")
    return {v: cmap(0.85 * i / max(len(values) - 1, 1)) for i, v in enumerate(values)}


def heads_label(heads) -> str:
    return f"{heads} head" if heads == 1 else f"{heads} heads"
