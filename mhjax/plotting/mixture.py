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
The loss figures (loss_vs_K, test_loss_vs_n) are drawn here, the geometry's (ntk_margin_vs_H,
path) by plotting/mixture_geometry.py; titles, colours and log axes are plotting/mixture_style.py's.
"""

from __future__ import annotations

import sys

import numpy as np

from mhjax.io import trace
from mhjax.io.curves import train_window
from mhjax.io.results import write_text
from mhjax.io.workdir import Workdir
from mhjax.plotting.mixture_geometry import plot_margin_vs_H, plot_path
from mhjax.plotting.mixture_style import (
    NothingToDraw,
    Style,
    head_colours,
    log_axes,
    member_curves,
    readable_ticks,
)
from mhjax.plotting.mixture_summary import edge_crossings, group_by, kept, mean_of, summary_markdown, values_of

SUMMARY = "mixture_summary.md"


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
    crossings = edge_crossings(lambda name, tags: member_curves(workdir, name, tags), kept(records))
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
        ("ntk_margin_vs_H.png", 11, lambda fig: plot_margin_vs_H(fig, records, style)),
        ("path.png", 14, lambda fig: plot_path(fig, workdir, records, style)),
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
    found = member_curves(workdir, record["name"], ["train/loss"]).get("train/loss")
    if found is None:
        return np.zeros(0), np.zeros(0)
    return found[0] - (train_window(chunk_steps) - 1) / 2, found[1]


def _plot_loss_vs_K(fig, workdir, records, chunk_steps, style, slope_window=(0.1, 1.0)):
    panels = group_by(records, ("num_train", "step_size"))
    colors = head_colours(r["heads"] for r in records)
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
    colors = head_colours(r["heads"] for r in records)
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


def theory_constant(reference, values) -> float:
    """The c of ``c * reference`` closest to ``values`` in the least-squares sense on log axes
    (the figure's): exp of the mean of log(values / reference) over every point."""
    return float(np.exp(np.mean(np.log(np.asarray(values, float) / np.asarray(reference, float)))))


def fitted_slope(x, y) -> float:
    """Least-squares slope of log y against log x."""
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])
