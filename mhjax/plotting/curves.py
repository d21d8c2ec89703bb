"""report/curves.png: the members' TensorBoard curves against steps, a panel per (task, tag).

A line per member. Its colour is its value of one member field (``coloured``: the head count; a
mixture's step size), its line style its value of another (``styled``: the seed; a mixture's step
size), each value its own style however many there are (line_styles); where both fields are one
(a mixture: colour and style per step size) the head count is the marker. The legend lists each
field's values in order. A diverged member (results.json ``status``) is drawn faint with a cross
where it leaves the panel (or ends), and the axes' ranges are those of the other members (a distance from
theta_0 of 1e5 would flatten every healthy curve); the legend says so.
"""

from __future__ import annotations

import math

import numpy as np

from mhjax.plotting.report import arch_fields, task_label
from mhjax.plotting.style import heads_colours, heads_label, pyplot

CURVE_TAGS = (
    ("train/loss", "training loss"),
    ("eval/loss", "held-out loss"),
    ("eval/bits_per_byte", "held-out bits/byte"),  # text (data/text.py)
    ("eval/bits_per_token", "held-out bits/token"),
    ("eval/accuracy", "held-out accuracy"),
)
MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "<", ">")
_NAMED_STYLES = ("-", "--", ":", "-.", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 1)), (0, (8, 3, 2, 3)))


def line_styles(count: int) -> list:
    """``count`` line styles, no two alike: matplotlib's four, four more dash patterns, then dashes
    of growing length."""
    more = [(0, (4 + 2 * k, 2, 1, 2, 1, 2)) for k in range(max(count - len(_NAMED_STYLES), 0))]
    return list(_NAMED_STYLES[:count]) + more


def _curve_tags(curves: dict, limit: int = 6) -> list[tuple[str, str]]:
    found = {t for c in curves.values() for t in c}
    tags = [(t, label) for t, label in CURVE_TAGS if t in found]
    known = {t for t, _ in CURVE_TAGS}
    extra = sorted(t for t in found if t not in known)
    extra.sort(key=lambda t: ("_over_" in t, not t.endswith("loss"), not t.endswith("accuracy"), t))
    tags += [(t, t.split("/", 1)[-1].replace("_", " ")) for t in extra]
    return tags[:limit]


def _number_first(value):
    return (0, value, "") if isinstance(value, (int, float)) else (1, 0, str(value))


def _value_text(field: str, value) -> str:
    return f"{field} {value:g}" if isinstance(value, float) else f"{field} {value}"


class _Look:
    """Colour, line style and marker of each member, and the legend that explains them."""

    def __init__(self, members: list[dict], styled: str, coloured: str):
        from matplotlib import colormaps

        self.styled, self.coloured = styled, coloured
        self.kinds = sorted({m.get(styled) for m in members}, key=_number_first)
        self.styles = line_styles(len(self.kinds))
        self.colour_values, self.colours = [], {}  # none: matplotlib's cycle, a legend entry per member
        if all(coloured in m for m in members):
            self.colour_values = sorted({m[coloured] for m in members}, key=_number_first)
            if coloured == "heads":
                self.colours = heads_colours(self.colour_values)
            else:  # an ordered map, small to large, its pale end left out
                cmap, n = colormaps["plasma"], max(len(self.colour_values) - 1, 1)
                self.colours = {v: cmap(0.85 * i / n) for i, v in enumerate(self.colour_values)}
        self.heads = sorted({m["heads"] for m in members if m.get("heads") is not None}, key=_number_first)
        # colour and style tell one field apart: the head count is the marker
        self.by_marker = styled == coloured and bool(self.colours) and bool(self.heads)

    def of(self, member: dict, points: int) -> dict:
        look = {
            "color": self.colours.get(member.get(self.coloured)),
            "ls": self.styles[self.kinds.index(member.get(self.styled))],
            "ms": 3,
            "marker": "o" if points <= 30 else None,  # per-step training losses: a line
        }
        if self.by_marker and member.get("heads") in self.heads:
            look.update(marker=MARKERS[self.heads.index(member["heads"]) % len(MARKERS)], ms=4)
            look["markevery"] = None if points <= 30 else 0.1  # evenly along the drawn line, log axes too
        return look

    def label(self, member: dict) -> str | None:
        """The member's own legend entry: only where nothing else tells it apart (no colour field)."""
        return None if self.colours else member["name"]

    def legend(self, diverged: bool) -> dict:
        from matplotlib.lines import Line2D

        out = {}
        if self.by_marker:
            for k, v in enumerate(self.kinds):
                out[_value_text(self.styled, v)] = Line2D([], [], color=self.colours[v], ls=self.styles[k])
            for k, h in enumerate(self.heads):
                out[heads_label(h)] = Line2D([], [], color="0.3", ls="none", marker=MARKERS[k % len(MARKERS)], ms=4)
        else:
            for v in self.colour_values if self.colours else ():
                text = heads_label(v) if self.coloured == "heads" else _value_text(self.coloured, v)
                out[text] = Line2D([], [], color=self.colours[v], marker="o", ms=3)
            for k, v in enumerate(self.kinds if len(self.kinds) > 1 else ()):
                out[_value_text(self.styled, v)] = Line2D([], [], color="0.3", ls=self.styles[k])
        if diverged:
            out["diverged: faint, x where it leaves the panel or ends (axes set by the others)"] = Line2D(
                [], [], color="0.5", alpha=0.6, lw=1.0, marker="x", ms=7, mew=1.5
            )
        return out


def _points(curves: dict, member: dict, tag: str, loglog: bool):
    """(steps, values) of ``member``'s ``tag`` as a panel draws them: accuracies in %, finite values
    only, and on log-log axes positive ones only."""
    steps, values = curves[member["name"]][tag]
    steps, values = np.asarray(steps, float), np.asarray(values, float) * (100 if "accuracy" in tag else 1)
    keep = np.isfinite(values) & ((steps > 0) & (values > 0) if loglog else np.ones(steps.shape, bool))
    return steps[keep], values[keep]


def plot_curves(
    members: list[dict],
    curves: dict,
    path: str,
    styled: str = "seed",
    log_tags=(),
    coloured: str = "heads",
    baselines=None,
) -> bool:
    """A panel per (task, tag), a line per member (the module docstring says how it looks); a tag
    containing one of ``log_tags`` (e.g. "loss", "hessian") on log-log axes, where a rate is a slope
    (steps and values that are not positive left out). An accuracy's axis ends a little above 100%.
    ``baselines``: results.json's {task: n-gram bits} (text), drawn as horizontal lines on the
    held-out bits panel and, in nats, on the held-out loss panel. A loss panel (not log-log) spans the
    steps after 0 where the step-0 point is above them, and says so (_after_step_zero)."""
    from matplotlib.ticker import MaxNLocator

    tags = _curve_tags(curves)
    if not tags:
        return False
    plt = pyplot()
    arch = arch_fields(members)
    tasks = sorted({task_label(m, arch) for m in members})
    look = _Look(members, styled, coloured)
    # one row per task; a single task wraps its panels three to a row
    ncols = len(tags) if len(tasks) > 1 else min(3, len(tags))
    panels = [(task, tag, label) for task in tasks for tag, label in tags]
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.2 * nrows), squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    any_diverged = False
    for n, (task, tag, label) in enumerate(panels):
        ax = axes.flat[n]
        loglog = any(t in tag.lower() for t in log_tags)
        drawn = [m for m in members if task_label(m, arch) == task and tag in curves.get(m["name"], {})]
        healthy = [m for m in drawn if m.get("status") != "diverged"]
        for m in healthy:
            steps, values = _points(curves, m, tag, loglog)
            ax.plot(steps, values, label=look.label(m), **look.of(m, len(steps)))
        if loglog:
            ax.set_xscale("log")
            ax.set_yscale("log")
        _baseline_lines(ax, tag, (baselines or {}).get(next(iter({m.get("task") for m in drawn}), None)))
        limits = (ax.get_xlim(), ax.get_ylim()) if healthy else None  # the healthy members' ranges
        for m in (m for m in drawn if m.get("status") == "diverged"):
            any_diverged = True
            steps, values = _points(curves, m, tag, loglog)
            style = dict(look.of(m, len(steps)), alpha=0.6, lw=1.0, marker=None, markevery=None)
            ax.plot(steps, values, label=look.label(m), **style)
            inside = np.ones(steps.shape, bool)
            if limits:  # the cross where the curve leaves the panel, else at its end
                (x0, x1), (y0, y1) = (sorted(lim) for lim in limits)
                inside = (x0 <= steps) & (steps <= x1) & (y0 <= values) & (values <= y1)
            last = np.nonzero(inside)[0][-1:]
            ax.plot(steps[last], values[last], ls="none", marker="x", ms=7, mew=1.5, color=style["color"])
        if limits and not loglog and "accuracy" not in tag:  # the y-range of the steps after 0 (module docstring)
            task_baseline = (baselines or {}).get(next(iter({m.get("task") for m in drawn}), None))
            limits = (
                limits[0],
                _after_step_zero(ax, [_points(curves, m, tag, False) for m in healthy], tag, task_baseline, limits[1]),
            )
        if limits:  # a diverged curve runs off the panel, not the scale (1e5 would flatten the rest)
            ax.set_xlim(*limits[0])
            ax.set_ylim(*limits[1])
        ax.set(
            xlabel="step",
            ylabel=label + (" %" if "accuracy" in tag else ""),
            title=f"{task}: {label}" if task else label,
        )
        if not loglog:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps: no 2.5
        if "accuracy" in tag:  # a 100% line stays inside the frame
            bottom, top = ax.get_ylim()
            ax.set_ylim(bottom, min(top, 100 + max(0.04 * (100 - bottom), 0.5)))
        ax.grid(alpha=0.3)
    # one legend for every panel, right of them: inside, it covers the curves' ends
    legend = look.legend(any_diverged)
    for ax in axes.flat[: len(panels)]:  # members by name, where no field tells them apart
        for handle, text in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(text, handle)
    fig.tight_layout()
    if legend:
        fig.legend(legend.values(), legend.keys(), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True


def _after_step_zero(ax, points: list, tag: str, baseline: dict | None, ylim) -> tuple:
    """The y-range of the curves after step 0 (and the strongest baseline below them), where the step-0
    point lies outside it: the untrained model's loss (8 bits a byte) would squeeze the end's
    differences flat. Says so on the panel; else ``ylim`` as it is."""
    late = [v[s > 0] for s, v in points if (s > 0).any()]
    first = [v[s == 0] for s, v in points if (s == 0).any()]
    if not late or not first:
        return ylim
    low, high = min(float(v.min()) for v in late), max(float(v.max()) for v in late)
    scale = 1.0 if tag.startswith("eval/bits_per_") else math.log(2) if tag == "eval/loss" else None
    if baseline and scale is not None:
        bits = [
            baseline[f"{n}_bits"] for n in ("unigram", "bigram", "trigram") if baseline.get(f"{n}_bits") is not None
        ]
        low = min([low, *(b * scale for b in bits if b * scale >= low - (high - low))])
    top0 = max(float(v.max()) for v in first)
    if top0 <= high:
        return ylim
    pad = 0.06 * (high - low) or 0.05 * abs(high) or 0.05
    ax.annotate(
        f"step 0: {top0:.3g}, above the panel",
        (0.99, 0.98),
        xycoords="axes fraction",
        ha="right",
        va="top",
        fontsize="x-small",
        color="0.35",
    )
    return (low - pad, high + pad)


def _baseline_lines(ax, tag: str, baseline: dict | None) -> None:
    """The n-gram baselines of the panel's task as horizontal lines, in the panel's unit."""
    scale = 1.0 if tag.startswith("eval/bits_per_") else math.log(2) if tag == "eval/loss" else None
    if not baseline or scale is None:
        return
    for n, name in enumerate(("unigram", "bigram", "trigram")):
        if baseline.get(f"{name}_bits") is not None:
            value = baseline[f"{name}_bits"] * scale
            ax.axhline(value, color="0.45", ls=(0, (1 + 2 * n, 2)), lw=1)
            where = (0.01, value)  # left: the curves start high above the baselines
            ax.annotate(
                name,
                where,
                xycoords=("axes fraction", "data"),
                fontsize="x-small",
                color="0.35",
                va="bottom",
                annotation_clip=True,  # a baseline above a panel spanning the steps after 0: no stray label
            )
