"""`mhjax report`'s held-out accuracy by position: a panel per task (with its parameters and
architecture values), a line per head count, the mean over seeds."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from mhjax.plotting.report import arch_fields, task_label
from mhjax.plotting.style import heads_colours, heads_label, pyplot


def plot_accuracy_by_position(members: list[dict], path: str) -> bool:
    """Held-out accuracy against position (results.json ``eval_accuracy_by_position``), a panel
    per task (with its parameters) and a line per head count, the mean over seeds; positions the
    task never weights are left out. False when no member has it."""
    from matplotlib.ticker import MaxNLocator

    have = [m for m in members if m.get("eval_accuracy_by_position")]
    if not have:
        return False
    plt = pyplot()
    arch = arch_fields(have)
    tasks = sorted({task_label(m, arch) for m in have})
    colours = heads_colours([m.get("heads") for m in have])
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 3.2), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        by_heads = defaultdict(list)
        for m in have:
            if task_label(m, arch) == task:
                by_heads[m.get("heads")].append(
                    [np.nan if a is None else 100.0 * a for a in m["eval_accuracy_by_position"]]
                )
        for heads, rows in sorted(
            by_heads.items(), key=lambda kv: str(kv[0]) if not isinstance(kv[0], int) else f"{kv[0]:09d}"
        ):
            rows = np.array(rows, float)
            counts = np.isfinite(rows).sum(axis=0)  # the mean over seeds of the finite values
            mean = np.where(counts > 0, np.nansum(rows, axis=0) / np.maximum(counts, 1), np.nan)
            ax.plot(np.arange(rows.shape[1]), mean, marker=".", color=colours.get(heads), label=heads_label(heads))
        ax.set(xlabel="position (0 first)", ylabel="held-out accuracy %", ylim=(-2, 102), title=task or None)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # positions: no 2.5
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
