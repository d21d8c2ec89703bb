"""The report's figures over training steps (``mhjax analyze --steps``: analysis.json ``by_step``;
held-out curves from TensorBoard), one line per head count (mean over the members that share it,
a line style per task):

* ``steps_mixing_fidelity.png``: mixing time and minimax fidelity per layer against steps;
* ``steps_synergy.png``: the share of sequences on which the combined operator beats the best
  single head, per layer, against steps;
* ``steps_head_importance.png``: one chosen member's loss without each head (ablation), one panel
  per layer, a line per head;
* ``steps_accuracy.png``: held-out accuracy (``eval/accuracy``) against steps.
"""

from __future__ import annotations

import numpy as np

from mhjax.plotting.style import heads_colours, heads_label, pyplot

STYLES = ("-", "--", ":", "-.")


def by_step(analysis: dict | None) -> dict[int, dict]:
    """{step: {member: entry}} of an analysis, ascending; {} without ``by_step``."""
    steps = (analysis or {}).get("by_step") or {}
    return {int(k): steps[k] for k in sorted(steps, key=int)}


def _groups(steps: dict) -> dict[tuple, list[str]]:
    """{(task, heads): member names} over every step's members."""
    out = {}
    for members in steps.values():
        for name, entry in members.items():
            names = out.setdefault((entry.get("task"), entry.get("heads")), [])
            if name not in names:
                names.append(name)
    return dict(sorted(out.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])))


def _layer_series(steps: dict, names: list[str], key: str, layer: int, scale: float):
    """(steps, mean over ``names``) of a layer's ``key``, steps where any member has it."""
    xs, ys = [], []
    for step, members in steps.items():
        values = [
            scale * float(members[n]["layers"][layer][key])
            for n in names
            if n in members and layer < len(members[n]["layers"]) and members[n]["layers"][layer].get(key) is not None
        ]
        if values:
            xs.append(step)
            ys.append(np.nanmean(values))
    return xs, ys


def _num_layers(steps: dict) -> int:
    return max((len(e["layers"]) for members in steps.values() for e in members.values()), default=0)


def _step_axis(ax, steps) -> None:
    """Steps on a symlog axis when they span two decades or more (log-spaced snapshots)."""
    positive = sorted(s for s in steps if s > 0)
    if len(positive) > 1 and positive[-1] >= 100 * positive[0]:
        ax.set_xscale("symlog", linthresh=1)


def _finish(fig, axes, path: str) -> None:
    plt = pyplot()
    legend = {}
    for ax in np.ravel(axes):
        ax.grid(alpha=0.3)
        for handle, text in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(text, handle)
    fig.tight_layout()
    fig.legend(legend.values(), legend.keys(), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _per_layer_figure(analysis: dict, path: str, rows: list[tuple[str, float, str]], skip_one: bool = False) -> bool:
    steps = by_step(analysis)
    layers = _num_layers(steps)
    if len(steps) < 2 or not layers:
        return False
    groups = {g: n for g, n in _groups(steps).items() if not (skip_one and g[1] == 1)}
    if not groups:
        return False
    plt = pyplot()
    colours = heads_colours([h for _, h in _groups(steps)])
    tasks = sorted({t for t, _ in groups}, key=str)
    fig, axes = plt.subplots(len(rows), layers, figsize=(4.2 * layers, 3.2 * len(rows)), squeeze=False)
    for r, (key, scale, label) in enumerate(rows):
        for layer in range(layers):
            ax = axes[r][layer]
            for (task, heads), names in groups.items():
                xs, ys = _layer_series(steps, names, key, layer, scale)
                style = STYLES[tasks.index(task) % len(STYLES)]
                text = heads_label(heads) + (f", {task}" if len(tasks) > 1 else "")
                ax.plot(xs, ys, style, marker="o", ms=3, color=colours[heads], label=text)
            ax.set(xlabel="step", ylabel=label, title=f"layer {layer}")
            _step_axis(ax, steps)
    _finish(fig, axes, path)
    return True


def plot_mixing_fidelity_steps(analysis: dict, path: str) -> bool:
    rows = [("mixing_time_mean", 1.0, "mixing time"), ("fidelity_pct_mean", 1.0, "minimax fidelity %")]
    return _per_layer_figure(analysis, path, rows)


def plot_synergy_steps(analysis: dict, path: str) -> bool:
    """Head counts above 1 only: one head's combined operator is that head."""
    rows = [("combined_beats_best_share", 100.0, "combined beats best head, %")]
    return _per_layer_figure(analysis, path, rows, skip_one=True)


def chosen_member(analysis: dict) -> str | None:
    """The member whose heads the importance figure draws: the first with the most heads that
    has ablation results at the latest step."""
    steps = by_step(analysis)
    if not steps:
        return None
    latest = steps[max(steps)]
    ablated = sorted(
        (-e["heads"], name) for name, e in latest.items() if e["layers"] and e["layers"][0].get("ablation")
    )
    return ablated[0][1] if ablated else None


def plot_head_importance_steps(analysis: dict, path: str, member: str | None = None) -> bool:
    """``member``'s (default: chosen_member) loss with each head removed, against steps: one panel
    per layer, a line per head, the loss with every head dashed."""
    steps = by_step(analysis)
    member = member or chosen_member(analysis)
    have = {s: m[member] for s, m in steps.items() if member in m}
    if len(have) < 2:
        return False
    layers = max(len(e["layers"]) for e in have.values())
    heads = max(e["heads"] for e in have.values())
    plt = pyplot()
    colours = pyplot().get_cmap("tab10" if heads <= 10 else "viridis")
    fig, axes = plt.subplots(1, layers, figsize=(4.2 * layers, 3.2), squeeze=False)
    for layer in range(layers):
        ax = axes[0][layer]
        xs = [s for s, e in have.items() if (e["layers"][layer].get("ablation") or {}).get("loss_without")]
        for h in range(heads):
            ys = [float(have[s]["layers"][layer]["ablation"]["loss_without"][h]) for s in xs]
            colour = colours(h % 10) if heads <= 10 else colours(h / max(heads - 1, 1))
            ax.plot(xs, ys, marker="o", ms=3, color=colour, label=f"without head {h}")
        ax.plot(xs, [float(have[s]["loss"]) for s in xs], "k--", label="every head")
        ax.set(xlabel="step", ylabel="loss", title=f"{member}: layer {layer}")
        _step_axis(ax, xs)
    _finish(fig, axes, path)
    return True


def plot_accuracy_steps(members: list[dict], curves: dict, path: str, tag: str = "eval/accuracy") -> bool:
    """Held-out accuracy against steps, mean over the members of each (task, head count)."""
    groups = {}
    for m in members:
        if tag in curves.get(m["name"], {}):
            groups.setdefault((m.get("task"), m.get("heads")), []).append(curves[m["name"]][tag])
    if not groups or any(h is None for _, h in groups):
        return False
    plt = pyplot()
    colours = heads_colours([h for _, h in groups])
    tasks = sorted({t for t, _ in groups}, key=str)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for (task, heads), series in sorted(groups.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        common = sorted(set.intersection(*(set(int(s) for s in steps) for steps, _ in series)))
        values = [dict(zip((int(s) for s in steps), vals)) for steps, vals in series]
        ys = [100 * np.nanmean([v[s] for v in values]) for s in common]
        text = heads_label(heads) + (f", {task}" if len(tasks) > 1 else "")
        ax.plot(common, ys, STYLES[tasks.index(task) % len(STYLES)], marker="o", ms=3, color=colours[heads], label=text)
    ax.set(xlabel="step", ylabel="held-out accuracy %", title="held-out accuracy (mean over seeds)")
    _step_axis(ax, [int(s) for series in groups.values() for steps, _ in series for s in steps])
    _finish(fig, np.array([ax]), path)
    return True
