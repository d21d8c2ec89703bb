"""Figures of the reproduction report: learning curves over seeds, and mhjax beside the released models.

The released models are those of "Beyond Parallelism: Synergistic Computational Graph Effects
in Multi-Head Attention" (arXiv 2507.02944), Section 4. Each function writes one PNG and
returns False when it has nothing to draw.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from mhjax.plotting.style import heads_colours, heads_label, pyplot

CURVE_PANELS = (
    ("train/loss", "training loss", 1.0),
    ("eval/loss", "held-out loss", 1.0),
    ("eval/accuracy", "held-out accuracy %", 100.0),
)
LAYER_PANELS = (
    ("mixing_time_mean", "mixing time (steps to sink)", 1.0),
    ("fidelity_pct_mean", "minimax fidelity %", 1.0),
    ("combined_beats_best_share", "combined beats best head, % of sequences", 100.0),
)


def _band(runs: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and std over seeds at the steps every seed logged (a member stopped early shortens the band)."""
    common = set(runs[0][0].tolist())
    for steps, _ in runs[1:]:
        common &= set(steps.tolist())
    steps = np.array(sorted(common))
    values = np.array([[dict(zip(s.tolist(), v))[x] for x in steps] for s, v in runs], float)
    return steps, values.mean(axis=0), values.std(axis=0)


def plot_curve_bands(members: list[dict], curves: dict, path: str) -> bool:
    """One row per task: training loss, held-out loss and accuracy against steps, mean ± std over seeds per H."""
    runs = defaultdict(list)  # (task, heads, tag) -> [(steps, values)]
    for m in members:
        for tag, _, _ in CURVE_PANELS:
            if tag in curves.get(m["name"], {}) and len(curves[m["name"]][tag][0]):
                runs[(m["task"], m["heads"], tag)].append(curves[m["name"]][tag])
    if not runs:
        return False
    tasks = sorted({t for t, _, _ in runs})
    colours = heads_colours(h for _, h, _ in runs)
    plt = pyplot()
    fig, axes = plt.subplots(
        len(tasks), len(CURVE_PANELS), figsize=(4.4 * len(CURVE_PANELS), 3.3 * len(tasks)), squeeze=False
    )
    for r, task in enumerate(tasks):
        for c, (tag, label, scale) in enumerate(CURVE_PANELS):
            ax = axes[r][c]
            for heads, colour in colours.items():
                if (task, heads, tag) not in runs:
                    continue
                seeds = runs[(task, heads, tag)]
                steps, mean, std = _band(seeds)
                ax.plot(steps, scale * mean, color=colour, label=f"{heads_label(heads)} ({len(seeds)} seeds)")
                low = np.maximum(mean - std, 0.1 * mean) if "loss" in tag else mean - std  # log axis: stay positive
                ax.fill_between(steps, scale * low, scale * (mean + std), color=colour, alpha=0.25, lw=0)
            ax.set(xlabel="step", ylabel=label, title=f"{task}: {label}")
            if "loss" in tag:
                ax.set_yscale("log")
            ax.grid(alpha=0.3)
        axes[r][-1].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _per_layer(entries: list[dict], key: str, scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    num_layers = min(len(e["layers"]) for e in entries)
    values = np.array([[scale * float(e["layers"][i][key]) for i in range(num_layers)] for e in entries])
    return np.arange(num_layers), values.mean(axis=0), values.std(axis=0)


def plot_beside_released(entries: list[dict], released: list[dict], path: str) -> bool:
    """One row per task: mixing time, minimax fidelity and synergy per layer; mhjax mean ± std over seeds
    (solid, error bars) beside the released checkpoint of the same H (dashed, open markers)."""
    tasks = sorted({e["task"] for e in entries} | {e["task"] for e in released})
    if not tasks:
        return False
    colours = heads_colours([e["heads"] for e in entries + released])
    plt = pyplot()
    fig, axes = plt.subplots(
        len(tasks), len(LAYER_PANELS), figsize=(4.6 * len(LAYER_PANELS), 3.5 * len(tasks)), squeeze=False
    )
    for r, task in enumerate(tasks):
        for c, (key, label, scale) in enumerate(LAYER_PANELS):
            ax = axes[r][c]
            for heads, colour in colours.items():
                ours = [e for e in entries if e["task"] == task and e["heads"] == heads]
                theirs = [e for e in released if e["task"] == task and e["heads"] == heads]
                if ours:
                    x, mean, std = _per_layer(ours, key, scale)
                    ax.errorbar(
                        x - 0.06,
                        mean,
                        yerr=std if len(ours) > 1 else None,
                        color=colour,
                        marker="o",
                        capsize=3,
                        label=f"mhjax, {heads_label(heads)}",
                    )
                if theirs:
                    x, mean, _ = _per_layer(theirs, key, scale)
                    ax.plot(
                        x + 0.06,
                        mean,
                        color=colour,
                        ls="--",
                        marker="s",
                        mfc="none",
                        label=f"released, {heads_label(heads)}",
                    )
            if key == "combined_beats_best_share":
                ax.axhline(50, color="grey", lw=0.8, ls=":")
            ax.set(xlabel="layer", ylabel=label, title=f"{task}: {label.split(' (')[0].split(',')[0]}")
            ax.set_xticks(range(max(len(e["layers"]) for e in entries + released)))
            ax.grid(alpha=0.3)
        axes[r][-1].legend(fontsize="x-small", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
