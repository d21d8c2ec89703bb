"""The report's figures over training steps (``mhjax analyze --steps``: analysis.json ``by_step``;
held-out curves from TensorBoard), one line per configuration: every swept field but the seed
(task, task parameters, architecture, heads, learning rate, ...), as the report's tables group
members (plotting/report.py). A line is the mean over the seeds of its configuration only; its
colour is its head count, its line style and marker the rest of its configuration:

* ``steps_mixing_fidelity.png``: mixing time and minimax fidelity per layer against steps;
* ``steps_synergy.png``: the share of sequences on which the combined operator beats the best
  single head, per layer, against steps;
* ``steps_head_importance.png``: one chosen member's loss without each head (ablation), one panel
  per layer, a line per head;
* ``steps_accuracy.png``: held-out accuracy (``eval/accuracy``) against steps.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from mhjax.plotting.architecture import ARCHITECTURE, value_label
from mhjax.plotting.report import field_value, group_keys, task_label
from mhjax.plotting.style import heads_colours, heads_label, pyplot

STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "v", "D", "P")
# the swept fields a line keeps apart when the caller does not name the sweep's own (Workdir.sweep_fields)
DEFAULT_FIELDS = ("task", "task_params", "heads", *ARCHITECTURE, "learning_rate")


class Line(NamedTuple):
    """One line of a figure over steps: the members of one configuration (they differ in the seed only)."""

    heads: int | None
    family: str  # the configuration but the head count, e.g. "after_marker (k=1), head_dim 16"; "" for one
    family_index: int  # its line style and marker
    names: list[str]

    def label(self) -> str:
        seeds = f"mean of {len(self.names)} seeds" if len(self.names) > 1 else "1 seed"
        return ", ".join(t for t in (heads_label(self.heads), self.family) if t) + f" ({seeds})"

    def style(self) -> dict:
        return {"ls": STYLES[self.family_index % len(STYLES)], "marker": MARKERS[self.family_index % len(MARKERS)]}


def by_step(analysis: dict | None) -> dict[int, dict]:
    """{step: {member: entry}} of an analysis, ascending; {} without ``by_step``."""
    steps = (analysis or {}).get("by_step") or {}
    return {int(k): steps[k] for k in sorted(steps, key=int)}


def config_lines(entries: dict[str, dict], sweep_fields=None) -> list[Line]:
    """The lines of ``entries`` ({member: entry}, by-step entries or results.json records): one per
    value of the swept fields but the seed (``sweep_fields``, default DEFAULT_FIELDS, where the
    entries differ), ordered by the rest of the configuration, then heads."""
    fields = group_keys(list(entries.values()), list(sweep_fields or DEFAULT_FIELDS))
    rest = [f for f in fields if f != "heads"]
    varying = [f for f in rest if len({str(field_value(e, f)) for e in entries.values()}) > 1]
    groups: dict[tuple, list[str]] = {}
    for name, entry in entries.items():
        groups.setdefault(tuple(field_value(entry, f) for f in fields), []).append(name)
    at = {f: i for i, f in enumerate(fields)}
    order = {}  # family -> its place: by its values, numbers in order (head_dim 8 before 16)
    lines = []
    for key, names in groups.items():
        family = _family(entries[names[0]], varying)
        rest_key = tuple(_order(key[at[f]]) for f in rest)
        order[family] = min(order.get(family, rest_key), rest_key)
        lines.append((family, entries[names[0]].get("heads"), names))
    families = sorted(order, key=order.get)
    lines.sort(key=lambda line: (families.index(line[0]), _order(line[1])))
    return [Line(heads, family, families.index(family), names) for family, heads, names in lines]


def _order(value):
    """Numbers first, in order, then the rest by name (None last)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return (value is None, not number, value if number else str(value))


def _family(entry: dict, varying: list[str]) -> str:
    """The words for the swept values but the head count that tell ``entry``'s line apart."""
    parts = []
    if "task" in varying or any(f.startswith("task_params") for f in varying):
        parts.append(task_label(entry))
    for f in varying:
        if f.startswith("task"):
            continue
        value = field_value(entry, f)
        parts.append(
            value_label(f, value)
            if f in ARCHITECTURE
            else f"{f} {value:g}"
            if isinstance(value, float)
            else f"{f} {value}"
        )
    return ", ".join(parts)


def _step_members(steps: dict) -> dict[str, dict]:
    """{member: its entry at the latest step that has it} over every step."""
    out = {}
    for members in steps.values():
        out.update(members)
    return out


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


def _per_layer_figure(
    analysis: dict, path: str, rows: list[tuple[str, float, str]], skip_one: bool = False, sweep_fields=None
) -> bool:
    steps = by_step(analysis)
    layers = _num_layers(steps)
    if len(steps) < 2 or not layers:
        return False
    every = config_lines(_step_members(steps), sweep_fields)
    lines = [line for line in every if not (skip_one and line.heads == 1)]
    if not lines:
        return False
    plt = pyplot()
    colours = heads_colours([line.heads for line in every])
    fig, axes = plt.subplots(len(rows), layers, figsize=(4.2 * layers, 3.2 * len(rows)), squeeze=False)
    for r, (key, scale, label) in enumerate(rows):
        for layer in range(layers):
            ax = axes[r][layer]
            for line in lines:
                xs, ys = _layer_series(steps, line.names, key, layer, scale)
                ax.plot(xs, ys, ms=3, color=colours[line.heads], label=line.label(), **line.style())
            ax.set(xlabel="step", ylabel=label, title=f"layer {layer}")
            _step_axis(ax, steps)
    fig.suptitle("one line per swept configuration, mean over its seeds only", fontsize="medium")
    _finish(fig, axes, path)
    return True


def plot_mixing_fidelity_steps(analysis: dict, path: str, sweep_fields=None) -> bool:
    rows = [("mixing_time_mean", 1.0, "mixing time"), ("fidelity_pct_mean", 1.0, "minimax fidelity %")]
    return _per_layer_figure(analysis, path, rows, sweep_fields=sweep_fields)


def plot_synergy_steps(analysis: dict, path: str, sweep_fields=None) -> bool:
    """Head counts above 1 only: one head's combined operator is that head."""
    rows = [("combined_beats_best_share", 100.0, "combined beats best head, %")]
    return _per_layer_figure(analysis, path, rows, skip_one=True, sweep_fields=sweep_fields)


def members_with_ablation(analysis: dict | None) -> list[str]:
    """The members with head ablation results at two or more analysed steps (the importance figure
    draws one of them), most heads first."""
    count: dict[str, int] = {}
    heads: dict[str, int] = {}
    for members in by_step(analysis).values():
        for name, e in members.items():
            if e.get("layers") and e["layers"][0].get("ablation"):
                count[name] = count.get(name, 0) + 1
                heads[name] = e.get("heads") or 0
    return sorted((n for n, c in count.items() if c >= 2), key=lambda n: (-heads[n], n))


def chosen_member(analysis: dict) -> str | None:
    """The member whose heads the importance figure draws by default: the first with the most heads that
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


def plot_accuracy_steps(
    members: list[dict], curves: dict, path: str, tag: str = "eval/accuracy", sweep_fields=None
) -> bool:
    """Held-out accuracy against steps, a line per configuration (config_lines): the mean over its
    seeds at the steps every one of them has."""
    have = {m["name"]: m for m in members if tag in curves.get(m["name"], {})}
    if not have or any(m.get("heads") is None for m in have.values()):
        return False
    lines = config_lines(have, sweep_fields)
    plt = pyplot()
    colours = heads_colours([line.heads for line in lines])
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for line in lines:
        series = [curves[name][tag] for name in line.names]
        common = sorted(set.intersection(*(set(int(s) for s in steps) for steps, _ in series)))
        values = [dict(zip((int(s) for s in steps), vals)) for steps, vals in series]
        ys = [100 * np.nanmean([v[s] for v in values]) for s in common]
        ax.plot(common, ys, ms=3, color=colours[line.heads], label=line.label(), **line.style())
    ax.set(
        xlabel="step",
        ylabel="held-out accuracy %",
        title="held-out accuracy (a line per configuration, mean over seeds)",
    )
    _step_axis(ax, [int(s) for name in have for s in curves[name][tag][0]])
    _finish(fig, np.array([ax]), path)
    return True
