"""Figures of a mixture sweep, from results.json records (and the TensorBoard train/loss curve
where a member has no recorded ``loss_curve``); mixture_summary.md comes from mixture_summary.py.

What each figure measures (the init scheme and the loss are in every figure's title: numbers
under "zero_plus_step" (identical heads) measure a learning-rate effect of H, not width):
  * loss_vs_K.png: train loss L(theta_k) against S_k = sum_{j<k} eta_j (= eta k for a constant step),
    (mean over seeds) with a band from the lowest to the highest seed, each H's slope (over
    analysis.slope_window: the last decade by default) as mean ± std over seeds in the legend,
    and a 1/S_k line through the first H's first point.
    Exact losses from ``loss_curve``; without it, TensorBoard chunk means at the chunk centre.
  * test_loss_vs_n.png: test loss at theta_K (mean, min-max over seeds) against n, a line per H
    with its fitted slope, a 1/n line, and c/(gamma^2 n) per H (gamma: that H's mean NTK margin
    per n, c fitted by least squares in log space over all its points); the generalization gap
    (test - train loss) beside it; a row per step size, and no figure when the sweep has one n.
  * path.png (when evaluated at several k): along the GD path, ||theta_k - theta_0|| against
    log(k)/gamma (the theory's radius), sqrt(H) lambda_min(Hessian)/L and eta lambda_max (the
    stability edge 2 drawn; both log-log where positive), mean over seeds per H (marker), every
    step size of the sweep's first n (a colour and line style each, the legend in order).
Diverged members are left out of every figure (the means would be theirs) and named in its title.
  * ntk_margin_vs_H.png: NTK margin at theta_0, mean +- std over seeds against H (left), and
    margins divided by the feature radius against the linear baselines (right).
The 1/S_k line, c/(gamma^2 n), sqrt(H) lambda_min / L and the slope verdict assume a loss with an
exponential tail; for another loss (the squared loss) they are left out and the titles say so.
Log axes carry major tick labels only (minor labels such as 3x10^1 and 4x10^1 overlap), except
an axis spanning at most one power of 10, which gets about four plain labels (readable_ticks).
"""

from __future__ import annotations

import sys

import numpy as np

from mhjax.io import trace
from mhjax.io.curves import train_window
from mhjax.io.results import write_text
from mhjax.io.workdir import Workdir
from mhjax.models import mixture_parts
from mhjax.plotting.curves import MARKERS, line_styles
from mhjax.plotting.mixture_summary import edge_crossings, group_by, kept, mean_of, summary_markdown, values_of

SUMMARY = "mixture_summary.md"


class NothingToDraw(Exception):
    """The records hold no data for this figure (it is left out without a message)."""


class Style:
    """What every panel says: the init scheme, the loss, whether it has an exponential tail, and
    the step rule whose S_k = sum_{j<k} eta_j is the clock of the rate figures."""

    def __init__(
        self, init: str = "?", loss: str = "logistic", tail: bool = True, step_rule: str = "constant", left_out=()
    ):
        self.init, self.loss, self.tail, self.step_rule = init, loss, tail, step_rule
        self.left_out = list(left_out)  # the diverged members, left out of every figure

    def clock(self, eta: float, steps):
        """S_k at ``steps`` for step size ``eta`` (models/mixture_parts.step_sums)."""
        return mixture_parts.step_sums(mixture_parts.get("step_rule", self.step_rule).fn, eta, steps)

    def suptitle(self, fig, what: str) -> None:
        note = "" if self.tail else " (no exponential tail: 1/S_K and c/(gamma^2 n) left out)"
        if self.left_out:
            named = ", ".join(self.left_out[:3]) + (
                f" and {len(self.left_out) - 3} more" if len(self.left_out) > 3 else ""
            )
            note += f"\n{len(self.left_out)} diverged member(s) left out: {named}"
        fig.suptitle(f"{what}; init={self.init}, loss={self.loss}{note}", fontsize=10)


def _curves(workdir: Workdir, name: str, tags) -> dict:
    """A member's TensorBoard curves ({} when it has no TensorBoard run)."""
    return workdir.curves(name, tags) if workdir.has_curves(name) else {}


def log_axes(ax, x: bool = True, y: bool = True, base: float = 10) -> None:
    """Log scale on ``x`` / ``y`` with major tick labels only."""
    from matplotlib.ticker import NullFormatter

    for flag, scale, axis in ((x, ax.set_xscale, ax.xaxis), (y, ax.set_yscale, ax.yaxis)):
        if flag:
            scale("log", base=base)
            axis.set_minor_formatter(NullFormatter())


def write_figures_and_summary(
    workdir: Workdir,
    records: list[dict],
    chunk_steps: int = 1,
    log=None,
    init: str = "?",
    loss: str = "logistic",
    exponential_tail: bool = True,
    generator: str | None = None,
    step_rule: str = "constant",
    slope_window=(0.1, 1.0),
) -> list[str]:
    """loss_vs_K.png, test_loss_vs_n.png, ntk_margin_vs_H.png, path.png and mixture_summary.md;
    returns the paths written. A figure that fails is skipped with a message (results are
    already saved). The members' TensorBoard runs are read once (``workdir`` keeps them)."""
    log = log or (lambda m: print(m, file=sys.stderr))
    workdir = Workdir.of(workdir)
    left_out = [r["name"] for r in records if r not in kept(records)]
    style = Style(init, loss, exponential_tail, step_rule, left_out)
    written = []
    path = workdir.file(SUMMARY)
    crossings = edge_crossings(lambda name, tags: _curves(workdir, name, tags), kept(records))
    write_text(path, summary_markdown(records, init, crossings, loss, exponential_tail, generator, slope_window))
    written.append(path)
    records = kept(records)  # the figures' means leave diverged members out, as the summary does
    if not records:
        log("mixture: figures skipped: every member diverged (mixture_summary.md names them)")
        return written
    panels = max(len(group_by(records, ("num_train", "step_size"))), 1)
    for filename, width, draw in (
        (
            "loss_vs_K.png",
            max(11, 4.2 * panels),
            lambda fig: _plot_loss_vs_K(fig, workdir, records, chunk_steps, style, slope_window),
        ),
        ("test_loss_vs_n.png", 11, lambda fig: _plot_test_loss_vs_n(fig, records, style)),
        ("ntk_margin_vs_H.png", 11, lambda fig: _plot_margin_vs_H(fig, records, style)),
        ("path.png", 14, lambda fig: _plot_path(fig, workdir, records, style)),
    ):
        try:
            from matplotlib.figure import Figure  # slow import: only when drawing

            fig = Figure(figsize=(width, 4.4), layout="constrained")
            draw(fig)
            path = workdir.file(filename)
            fig.savefig(path, dpi=110)
            written.append(path)
        except NothingToDraw:  # e.g. no evaluations along the path: not a failure
            continue
        except Exception as exc:  # a figure must never cost a finished run
            log(f"mixture: {filename} skipped ({type(exc).__name__}: {exc})")
    return written


def _colors(heads):
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    heads = sorted(set(heads))
    return {h: cmap(i / max(len(heads) - 1, 1)) for i, h in enumerate(heads)}


def _curve(workdir, record, chunk_steps):
    """(steps, values) of a member's train loss: the exact recorded curve, else the per-step trace
    (W/trace), else (a workdir of before the trace) TensorBoard's train/loss (at step s the mean
    of L(theta_k) over the trainer's window w up to s, placed at s - (w-1)/2)."""
    curve = record.get("loss_curve")
    if curve:
        values = np.array([np.nan if v is None else v for v in curve["values"]], float)
        return np.asarray(curve["steps"], float), values
    if trace.has_trace(workdir.trace_dir):
        found = trace.read(workdir.trace_dir, record["name"])
        return found["step"].astype(float), found["loss"].astype(float)
    found = _curves(workdir, record["name"], ["train/loss"]).get("train/loss")
    if found is None:
        return np.zeros(0), np.zeros(0)
    return found[0] - (train_window(chunk_steps) - 1) / 2, found[1]


def _plot_loss_vs_K(fig, workdir, records, chunk_steps, style, slope_window=(0.1, 1.0)):
    panels = group_by(records, ("num_train", "step_size"))
    colors = _colors(r["heads"] for r in records)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, ((n, eta), group) in zip(axes, panels.items()):
        anchor = None
        for (h,), members in group_by(group, ("heads",)).items():
            curves = [c for c in (_curve(workdir, r, chunk_steps) for r in members) if c[0].size]
            if not curves:
                continue
            length = min(c[0].size for c in curves)
            steps = style.clock(eta, curves[0][0][:length])  # the rate's clock S_k, not k
            stack = np.array([c[1][:length] for c in curves])
            values = np.mean(stack, axis=0)
            keep = (steps > 0) & np.isfinite(values) & (values > 0)
            slopes = values_of(members, "loss_slope")
            label = f"H={h}"
            if slopes.size:
                label += f": slope {slopes.mean():.2f}" + (f" ± {slopes.std():.2f}" if slopes.size > 1 else "")
            ax.plot(steps[keep], values[keep], color=colors[h], label=label)
            if len(curves) > 1:  # the seeds' band: lowest to highest
                lo, hi = np.min(stack, axis=0), np.max(stack, axis=0)
                band = keep & (lo > 0) & np.isfinite(hi)
                ax.fill_between(steps[band], lo[band], hi[band], color=colors[h], alpha=0.2, lw=0)
            if keep.any() and anchor is None:
                anchor = (steps[keep][0], values[keep][0], steps[keep][-1])
        if anchor is not None and style.tail:
            k0, l0, k1 = anchor
            ks = np.geomspace(k0, k1, 20)
            ax.plot(ks, l0 * k0 / ks, "k--", lw=1, label="1/S_k")
        log_axes(ax)
        ax.set_title(f"n={n}, eta={eta:g}", fontsize=9)
        constant = style.step_rule == "constant"
        ax.set_xlabel("S_k = eta k (k: GD step)" if constant else f"S_k = sum of eta_j over j < k ({style.step_rule})")
        ax.set_ylabel("train loss (mean, band: seeds' range)")
        ax.legend(fontsize=7)
    a, b = (float(v) for v in slope_window)  # analysis.slope_window: the legend's slopes
    over = "last decade" if (a, b) == (0.1, 1.0) else f"k in [{a:g} K, {b:g} K]"
    style.suptitle(fig, f"train loss against S_k; slope: {over}, mean ± std over seeds")


def _plot_test_loss_vs_n(fig, records, style):
    if len({r["num_train"] for r in records}) < 2:
        raise NothingToDraw("one training-set size: no curve against n")
    records = [dict(r, generalization_gap=_gap(r)) for r in records]
    panels = group_by(records, ("step_size",))
    axes = fig.subplots(len(panels), 2, squeeze=False)
    fig.set_size_inches(11, 4.4 * len(panels))  # a row per step size: panels stay readable
    for j, ((eta,), group) in enumerate(panels.items()):
        _draw_vs_n(axes[j, 0], group, "test_loss", f"test loss at theta_K, eta={eta:g}", records, style.tail)
        _draw_vs_n(axes[j, 1], group, "generalization_gap", f"test - train loss, eta={eta:g}", records, False)
    style.suptitle(fig, "generalization against n")


def _gap(record):
    test, train = record.get("test_loss"), record.get("train_loss_eval")
    return test - train if isinstance(test, float) and isinstance(train, float) else None


def _draw_vs_n(ax, group, field, title, records, theory: bool):
    """``field`` at theta_K (mean, min-max over seeds) against n, a line per H with its fitted
    slope; ``theory``: a 1/n line, and per H c/(gamma^2 n) with gamma its mean NTK margin per n
    (each scaled to the first point it passes through)."""
    colors = _colors(r["heads"] for r in records)
    heads = sorted(colors)
    first = None
    for (h,), members in group_by(group, ("heads",)).items():
        nudge = 1.0 + 0.015 * (heads.index(h) - (len(heads) - 1) / 2)  # keep error bars apart
        by_n = group_by(members, ("num_train",))
        ns = np.array([k[0] for k in by_n], dtype=float)
        vals = [values_of(v, field) for v in by_n.values()]
        mean = np.array([v.mean() if v.size else np.nan for v in vals])
        lo = np.array([v.min() if v.size else np.nan for v in vals])
        hi = np.array([v.max() if v.size else np.nan for v in vals])
        label = f"H={h}"
        ok = np.isfinite(mean) & (mean > 0)
        if ok.sum() >= 2:
            label += f" (slope {fitted_slope(ns[ok], mean[ok]):.2f})"
        ax.errorbar(ns * nudge, mean, yerr=[mean - lo, hi - mean], color=colors[h], marker="o", capsize=2, label=label)
        if not (theory and ok.any()):
            continue
        if first is None:
            first = (ns, ns[ok][0], mean[ok][0])
        gamma = np.array([mean_of(v, "ntk_margin") for v in by_n.values()])
        if np.all(gamma > 0):
            ref = 1.0 / (gamma**2 * ns)
            ax.plot(ns, ref * theory_constant(ref[ok], mean[ok]), ls=":", color=colors[h], lw=1.2)
    if first is not None:
        ns, n0, v0 = first
        ax.plot(ns, v0 * n0 / ns, "k--", lw=1, label="1/n")
        ax.plot([], [], ls=":", color="gray", label="c/(gamma^2 n) per H, c: least squares (log) over all n")
    log_axes(ax)
    sizes = sorted({r["num_train"] for r in group})
    ax.set_xticks(sizes, [str(n) for n in sizes])  # the sweep's n as labels: often less than a decade
    readable_ticks(ax, x=False)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("training set size n")
    ax.set_ylabel(f"{field} (mean, min-max over seeds)")
    ax.legend(fontsize=7)


def readable_ticks(ax, x: bool = True, y: bool = True) -> None:
    """Tick labels on a log axis of ``ax`` whose range holds one power of 10 or none (a log
    locator would label one tick or none): about four evenly spaced ticks, written plainly."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter

    for flag, axis, scale, limits in (
        (x, ax.xaxis, ax.get_xscale(), ax.get_xlim()),
        (y, ax.yaxis, ax.get_yscale(), ax.get_ylim()),
    ):
        low, high = sorted(limits)
        if not flag or scale != "log" or low <= 0 or np.floor(np.log10(high)) - np.ceil(np.log10(low)) >= 1:
            continue
        axis.set_major_locator(MaxNLocator(nbins=4))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
        axis.set_minor_formatter(NullFormatter())


def theory_constant(reference, values) -> float:
    """The c of ``c * reference`` closest to ``values`` in the least-squares sense on log axes
    (the figure's): exp of the mean of log(values / reference) over every point."""
    return float(np.exp(np.mean(np.log(np.asarray(values, float) / np.asarray(reference, float)))))


def fitted_slope(x, y) -> float:
    """Least-squares slope of log y against log x."""
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def _plot_margin_vs_H(fig, records, style):
    left, right = fig.subplots(1, 2)
    # The margin is taken at theta_0, which members differing only in eta share (their key leaves
    # eta out) unless theta_0 includes a first GD step of size eta: a line per (n, eta) only where
    # the margins differ, else one per n.
    lines: dict = {}  # n -> [(margins, eta, group)]
    for (n, eta), group in group_by(records, ("num_train", "step_size")).items():
        margins = sorted((r["heads"], r["seed"], r.get("ntk_margin")) for r in group)
        if all(margins != drawn for drawn, _, _ in lines.setdefault(n, [])):
            lines[n].append((margins, eta, group))
    for n, drawn in lines.items():
        for _, eta, group in drawn:
            _draw_margins(left, right, n, eta if len(drawn) > 1 else None, group)
    for ax in (left, right):
        log_axes(ax, y=False, base=2)
        ax.set_xlabel("heads H")
        ax.legend(fontsize=7)
    left.set_ylabel("NTK margin at theta_0 (mean ± std over seeds)")
    left.set_title("NTK margin vs H (<= 0: not separable)", fontsize=9)
    right.set_ylabel("margin / max feature norm")
    right.set_title("scale-free margins: NTK vs linear on raw inputs", fontsize=9)
    style.suptitle(fig, "NTK margin at theta_0")


def _draw_margins(left, right, n, eta, group):
    """One line per (n[, eta]): the NTK margin (left) and the scale-free margins (right)."""
    by_h = group_by(group, ("heads",))
    hs = np.array([h[0] for h in by_h], dtype=float)
    stats = [values_of(v, "ntk_margin") for v in by_h.values()]
    mean = np.array([s.mean() if s.size else np.nan for s in stats])
    std = np.array([s.std() if s.size else np.nan for s in stats])
    normed = np.array([mean_of(v, "ntk_margin_normalized") for v in by_h.values()])
    label = f"n={n}" if eta is None else f"n={n}, eta={eta:g}"
    line = left.errorbar(hs, mean, yerr=std, marker="o", capsize=3, label=label)
    color = line[0].get_color()
    right.plot(hs, normed, marker="o", color=color, label=f"NTK, {label}")
    right.axhline(mean_of(group, "linear_margin_normalized"), ls="--", color=color, lw=1, label=f"linear (flat), n={n}")
    right.axhline(
        mean_of(group, "linear_margin_mean_normalized"),
        ls=":",
        color=color,
        lw=1,
        label=f"linear (mean token), n={n}",
    )


PATH_TAGS = ("eval/distance_from_init", "eval/min_hessian_eig_over_loss_sqrtH", "eval/step_times_hessian_max")


def _plot_path(fig, workdir, records, style):
    """Every step size of the sweep's first n: a colour and a line style per eta (in order), a
    marker per H."""
    n = next(iter(group_by(records, ("num_train",))))[0]
    etas = group_by([r for r in records if r["num_train"] == n], ("step_size",))
    curves = {r["name"]: _curves(workdir, r["name"], PATH_TAGS) for group in etas.values() for r in group}
    if all(len(c.get(PATH_TAGS[0], ((),))[0]) < 3 for c in curves.values()):
        raise NothingToDraw("fewer than 3 evaluations along the path (set train.eval_points)")
    from matplotlib import colormaps
    from matplotlib.lines import Line2D

    heads = sorted({r["heads"] for r in records})
    markers = {h: MARKERS[i % len(MARKERS)] for i, h in enumerate(heads)}
    styles = line_styles(len(etas))
    cmap, last = colormaps["plasma"], max(len(etas) - 1, 1)
    looks = {eta: (cmap(0.85 * e / last), styles[e]) for e, ((eta,), _) in enumerate(etas.items())}
    axes = fig.subplots(1, 3)
    tags = [t for t in PATH_TAGS if style.tail or t != PATH_TAGS[1]]  # L-ratios need an exponential tail
    for (eta,), group in etas.items():
        colour, ls = looks[eta]
        for (h,), members in group_by(group, ("heads",)).items():
            found = [curves[r["name"]] for r in members if all(t in curves[r["name"]] for t in tags)]
            if not found:
                continue
            length = min(c[PATH_TAGS[0]][0].size for c in found)
            steps = found[0][PATH_TAGS[0]][0][:length].astype(float)
            mean = {t: np.mean([c[t][1][:length] for c in found], axis=0) for t in tags}
            gamma = mean_of(members, "ntk_margin")
            keep = steps > 0
            look = dict(ls=ls, marker=markers[h], ms=4, color=colour)
            if gamma > 0:
                axes[0].plot(np.log(steps[keep]) / gamma, mean[PATH_TAGS[0]][keep], **look)
            for ax, tag in ((axes[1], PATH_TAGS[1]), (axes[2], PATH_TAGS[2])):
                if tag in mean:
                    ax.plot(np.maximum(steps, 0.5), mean[tag], **look)
    axes[2].axhline(2.0, color="k", ls="--", lw=1)
    axes[0].set_xlabel("log(k) / gamma (gamma: NTK margin at theta_0)")
    axes[0].set_ylabel("||theta_k - theta_0||")
    axes[0].set_title("distance from theta_0", fontsize=9)
    eta_note = f"eta={next(iter(etas))[0]:g}" if len(etas) == 1 else "colour and line style: eta, marker: H"
    style.suptitle(fig, f"along the GD path, n={n}, {eta_note}, mean over seeds")
    for ax, label in ((axes[1], "sqrt(H) lambda_min / L"), (axes[2], "eta lambda_max")):
        positive = ax.get_lines() and all(np.all(np.asarray(line.get_ydata(), float) > 0) for line in ax.get_lines())
        log_axes(ax, y=bool(positive))  # Hessian quantities log-log where they are positive
        readable_ticks(ax, x=False)
        ax.set_xlabel("GD step k (k=0 drawn at 0.5)")
        ax.set_ylabel(label)
        ax.set_title(label, fontsize=9)
    if not style.tail:
        axes[1].set_title(f"sqrt(H) lambda_min / L: left out ({style.loss} loss)", fontsize=9)
    # one legend, in order: each eta (its colour and style), each H (its marker), the stability edge
    legend = {f"eta={eta:g}": Line2D([], [], color=c, ls=ls) for (eta,), (c, ls) in zip(etas, looks.values())}
    legend.update({f"H={h}": Line2D([], [], color="0.3", ls="none", marker=markers[h], ms=4) for h in heads})
    legend["stability edge 2"] = Line2D([], [], color="k", ls="--", lw=1)
    fig.legend(legend.values(), legend.keys(), loc="outside right center", fontsize=7)
