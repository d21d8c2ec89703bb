"""The figure of Example 2 (Figure 3 of arXiv 2507.02944)."""

from __future__ import annotations

import numpy as np

from mhjax.analysis.example2 import NODES
from mhjax.plotting.style import pyplot


def plot_example2(signals: dict[str, np.ndarray], path) -> None:
    """One panel per operator: the signals s_u, s_v, s_w at the sink (percent) against t and the
    running minimax fidelity (dashed)."""
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    titles = {"head1": "Head 1", "head2": "Head 2", "multi_head": "Multi-head (0.5/0.5)"}
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), sharey=True)
    for ax, (name, s) in zip(axes, signals.items()):
        t = np.arange(1, s.shape[0] + 1)
        for j, node in enumerate(NODES[:-1]):
            ax.plot(t, 100 * s[:, j], marker="o", ms=3, label=f"$s_{node}(t)$")
        # running minimax: min over nodes of the best signal seen so far
        running = 100 * np.maximum.accumulate(s[:, :-1], axis=0).min(axis=1)
        ax.plot(t, running, "k--", label=r"running $\phi_{\min}$")
        ax.set_title(f"{titles[name]}: $\\phi_{{\\min}}$ = {running[-1]:.1f}%")
        ax.set_xlabel("steps t")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("% of signal at sink")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
