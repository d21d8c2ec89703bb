"""Report figures of a sweep over architecture axes (docs/sweeps.md): heads on the x-axis, one line
per value of the first swept architecture field (e.g. head_dim 8 and 16), one panel per value of
a second (and one row per task); and held-out accuracy against parameter count.

Reads the results.json members (``eval_accuracy``, ``params``) and analysis.json entries
(per-layer ``fidelity_pct_mean``, ``combined_beats_best_share``): plain dicts, no experiment code.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from mhjax.plotting.style import pyplot

# experiments/architecture.py's FIELDS (plotting sits left of experiments: it cannot import them)
ARCHITECTURE = ("width", "num_layers", "mlp_dim", "dropout", "head_dim")
_MATCHED = "matched (width / H)"  # head_dim None: parameter matching


def architecture_axes(members: list[dict], sweep_fields) -> list[str]:
    """The architecture fields the sweep takes more than one value of, in sweep order."""
    fields = [f for f in (sweep_fields or ()) if f in ARCHITECTURE]
    return [f for f in fields if len({str(m.get(f)) for m in members}) > 1]


def value_label(field: str, value) -> str:
    if field == "head_dim" and value is None:
        return f"head_dim {_MATCHED}"
    return f"{field} {value}"


def _order(value):
    return (value is not None, value if isinstance(value, (int, float)) else str(value))


def _layer_mean(key: str, scale: float = 100.0, skip_one_head: bool = False):
    """An analysis entry -> the mean over its layers of ``key`` (x scale), None where absent."""

    def value(entry: dict):
        if skip_one_head and entry.get("heads") == 1:  # one head's combined operator is that head
            return None
        values = [layer.get(key) for layer in entry.get("layers", [])]
        values = [v for v in values if isinstance(v, (int, float))]
        return scale * float(np.mean(values)) if values else None

    return value


def _accuracy(entry: dict):
    value = entry.get("eval_accuracy")
    return None if value is None else 100.0 * float(value)


def _grid(entries: list[dict], axes_fields: list[str]):
    """{(task, panel value): {line value: {heads: [entries]}}}, diverged members left out; with
    more than two axes the rest join the panel's value."""
    line, panel = axes_fields[0], tuple(axes_fields[1:])
    grid = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for e in entries:
        if e.get("status") == "diverged" or e.get("heads") is None:
            continue
        grid[(str(e.get("task", "")), tuple(e.get(f) for f in panel))][e.get(line)][int(e["heads"])].append(e)
    return grid


def _panel_title(task: str, fields: tuple, values: tuple) -> str:
    inner = ", ".join(value_label(f, v) for f, v in zip(fields, values))
    return f"{task}: {inner}" if inner else task


def plot_against_heads(entries: list[dict], axes_fields: list[str], value, ylabel: str, path: str, high=None) -> bool:
    """Mean ± sd over seeds of ``value(entry)`` against heads, one line per value of
    ``axes_fields[0]``, one panel per task and value of the others; False when nothing to draw."""
    if not axes_fields:
        return False
    grid = _grid(entries, axes_fields)
    panels = {}
    for key, lines in grid.items():
        drawn = {}
        for lv, by_heads in lines.items():
            points = []
            for h in sorted(by_heads):
                values = [v for v in (value(e) for e in by_heads[h]) if v is not None and np.isfinite(v)]
                if values:
                    points.append((h, float(np.mean(values)), float(np.std(values))))
            if points:
                drawn[lv] = points
        if drawn:
            panels[key] = drawn
    if not panels:
        return False
    plt = pyplot()
    keys = sorted(panels, key=lambda k: (k[0], tuple(_order(v) for v in k[1])))
    tasks = sorted({k[0] for k in keys})
    columns = max(sum(1 for k in keys if k[0] == t) for t in tasks)
    fig, axes = plt.subplots(len(tasks), columns, figsize=(4.6 * columns, 3.4 * len(tasks)), squeeze=False)
    used = set()
    every_line = sorted({lv for drawn in panels.values() for lv in drawn}, key=_order)
    colours = {lv: plt.get_cmap("tab10")(i % 10) for i, lv in enumerate(every_line)}
    for r, task in enumerate(tasks):
        for c, key in enumerate(k for k in keys if k[0] == task):
            ax, used = axes[r][c], used | {(r, c)}
            for lv in sorted(panels[key], key=_order):
                h, mean, sd = (np.array(a) for a in zip(*panels[key][lv]))
                label = value_label(axes_fields[0], lv)
                ax.errorbar(h, mean, yerr=sd, marker="o", capsize=3, color=colours[lv], label=label)
            heads = sorted({h for points in panels[key].values() for h, _, _ in points})
            ax.set_xscale("log", base=2)
            ax.set_xticks(heads, [str(h) for h in heads])
            ax.minorticks_off()
            if high is not None:
                ax.set_ylim(top=high)
            ax.set(xlabel="heads", ylabel=ylabel)
            ax.set_title(_panel_title(task, tuple(axes_fields[1:]), key[1]), fontsize="medium")
            ax.legend(fontsize="small")
    for r in range(len(tasks)):
        for c in range(columns):
            if (r, c) not in used:
                axes[r][c].set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True


def plot_accuracy_vs_params(members: list[dict], axes_fields: list[str], path: str) -> bool:
    """Held-out accuracy (mean ± sd over seeds) against parameter count, one line per value of
    the swept architecture fields through the head counts (each point labelled H, no label over
    another: place_point_labels), one panel per task; False without parameter counts."""
    fig = accuracy_vs_params_figure(members, axes_fields)
    if fig is None:
        return False
    fig.savefig(path, dpi=110, bbox_inches="tight")
    pyplot().close(fig)
    return True


def accuracy_vs_params_figure(members: list[dict], axes_fields: list[str]):
    """plot_accuracy_vs_params's figure (None: nothing to draw), laid out, its point labels placed."""
    groups = defaultdict(lambda: defaultdict(list))  # {task: {arch values: [members]}}
    for m in members:
        if m.get("status") != "diverged" and m.get("params") and _accuracy(m) is not None:
            groups[str(m.get("task", ""))][tuple(m.get(f) for f in axes_fields)].append(m)
    if not groups:
        return None
    plt = pyplot()
    tasks = sorted(groups)
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.2 * len(tasks), 3.6), squeeze=False)
    every = sorted({k for g in groups.values() for k in g}, key=lambda k: tuple(_order(v) for v in k))
    colours = {k: plt.get_cmap("tab10")(i % 10) for i, k in enumerate(every)}
    labels = {}  # {axes: [(x, y, text, colour)]}
    for c, task in enumerate(tasks):
        ax = axes[0][c]
        for key in sorted(groups[task], key=lambda k: tuple(_order(v) for v in k)):
            by_heads = defaultdict(list)
            for m in groups[task][key]:
                by_heads[int(m.get("heads") or 0)].append(m)
            points = []
            for h in sorted(by_heads):
                accuracy = [_accuracy(m) for m in by_heads[h]]
                points.append((h, float(np.mean([m["params"] for m in by_heads[h]])), *_mean_sd(accuracy)))
            _, x, y, sd = (np.array(a) for a in zip(*points))
            label = ", ".join(value_label(f, v) for f, v in zip(axes_fields, key)) or task
            ax.errorbar(x, y, yerr=sd, marker="o", capsize=3, color=colours[key], label=label)
            labels.setdefault(ax, []).extend((px, py, f"H{h}", colours[key]) for h, px, py, _ in points)
        ax.set_xscale("log")
        ax.set(xlabel="parameters", ylabel="held-out accuracy %")
        ax.set_title(task, fontsize="medium")
    # one legend right of the panels: inside, it covers points and their labels
    handles, texts = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, texts, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
    fig.tight_layout()
    for ax, points in labels.items():  # after the layout: labels are placed in the final pixels
        place_point_labels(ax, points)
    return fig


_RINGS = (3, 6, 10, 15, 22, 32)  # offsets (points) a label tries around its point, nearest first
_DIRECTIONS = ((1, 1), (1, -1), (-1, 1), (-1, -1), (1, 0), (-1, 0), (0, 1), (0, -1))


def place_point_labels(ax, points, fontsize="x-small") -> list:
    """Annotate each (x, y, text, colour) of ``points`` beside its point, in its colour, where the
    text covers no other label and no point's marker: the nearest free offset around it inside the
    panel, else stacked above until free, with a thin leader line when it moved away; returns the
    annotations. Call once the figure's layout and limits are final (the pixels are measured)."""
    from matplotlib.transforms import Bbox

    renderer = ax.figure.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    centres = ax.transData.transform([(x, y) for x, y, _, _ in points])
    half = 3.5 * ax.figure.dpi / 72.0  # a marker's half size (6 points) in pixels, and a little
    taken = [Bbox.from_extents(cx - half, cy - half, cx + half, cy + half) for cx, cy in centres]
    around = [(r * dx, r * dy) for r in _RINGS for dx, dy in _DIRECTIONS]
    above = [(0, _RINGS[-1] + 8 * k) for k in range(1, 4 * len(points) + 2)]  # always one free at last

    def annotate(x, y, text, colour, offset, leader=False):
        dx, dy = offset
        return ax.annotate(
            text,
            (x, y),
            textcoords="offset points",
            xytext=offset,
            fontsize=fontsize,
            color=colour,
            ha="left" if dx > 0 else "right" if dx < 0 else "center",
            va="bottom" if dy > 0 else "top" if dy < 0 else "center",
            arrowprops=dict(arrowstyle="-", lw=0.5, color=colour, shrinkA=0, shrinkB=2) if leader else None,
        )

    out = []
    for x, y, text, colour in points:
        for offset, inside in [(o, True) for o in around] + [(o, False) for o in above]:
            note = annotate(x, y, text, colour, offset)
            box = note.get_window_extent(renderer)
            if not any(box.overlaps(t) for t in taken) and (not inside or _within(box, frame)):
                break
            note.remove()
        if max(map(abs, offset)) > _RINGS[1]:  # far from its point: a leader line says whose it is
            note.remove()
            note = annotate(x, y, text, colour, offset, leader=True)
        taken.append(box)
        out.append(note)
    return out


def _within(box, frame) -> bool:
    return frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1


def _mean_sd(values) -> tuple[float, float]:
    return float(np.mean(values)), float(np.std(values))


def architecture_figures(members: list[dict], analysis: dict | None, sweep_fields) -> list[tuple]:
    """(file name, function, arguments, caption) of each figure a sweep over architecture axes
    gets (none without one): accuracy, fidelity and synergy against heads, accuracy against
    parameters. ``function(*arguments, path)`` draws it and says whether it did."""
    axes_fields = architecture_axes(members, sweep_fields)
    if not axes_fields:
        return []
    entries = list((analysis or {}).get("members", {}).values())
    where = f"one line per {axes_fields[0]}" + (
        f", one panel per {', '.join(axes_fields[1:])}" if axes_fields[1:] else ""
    )
    return [
        (
            "arch_accuracy.png",
            plot_against_heads,
            (members, axes_fields, _accuracy, "held-out accuracy %"),
            f"Held-out accuracy against heads, {where}",
        ),
        (
            "arch_fidelity.png",
            plot_against_heads,
            (entries, axes_fields, _layer_mean("fidelity_pct_mean", 1.0), "minimax fidelity % (mean over layers)"),
            f"Minimax fidelity (mean over layers, `mhjax analyze`) against heads, {where}",
        ),
        (
            "arch_synergy.png",
            plot_against_heads,
            (
                entries,
                axes_fields,
                _layer_mean("combined_beats_best_share", skip_one_head=True),
                "combined > best head, % of sequences",
            ),
            f"Synergy (combined operator beats the best head) against heads, {where}; "
            "1 head left out (its combined operator is that head)",
        ),
        (
            "accuracy_params.png",
            plot_accuracy_vs_params,
            (members, axes_fields),
            "Held-out accuracy against parameters, one point per head count H",
        ),
    ]
