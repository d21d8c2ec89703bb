"""What every figure shares: pyplot on the file-only Agg backend, one colour and label per head
count, and error bars kept inside a quantity's range."""

from __future__ import annotations

import numpy as np


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


def clipped_sd(mean, sd, low: float = 0.0, high: float = np.inf):
    """Error bars of ``mean`` ± ``sd`` cut at [low, high] (a percentage never below 0 nor above
    100): matplotlib's (2, N) ``yerr``; None for no ``sd``."""
    if sd is None:
        return None
    mean, sd = np.asarray(mean, float), np.asarray(sd, float)
    return np.stack([np.clip(np.minimum(sd, mean - low), 0, None), np.clip(np.minimum(sd, high - mean), 0, None)])
