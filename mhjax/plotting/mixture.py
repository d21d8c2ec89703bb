"""Figures and mixture_summary.md of a mixture sweep, from results.json records (and the
TensorBoard train/loss curve where a member has no recorded ``loss_curve``).

What each figure measures:
  * loss_vs_K.png: train loss L(theta_k) (mean over seeds) against k, log-log, a panel per
    (n, eta), a line per H, with a 1/K line through the H=1 curve's first point. Exact losses
    from ``loss_curve``; without it, TensorBoard chunk means plotted at the chunk centre.
  * test_loss_vs_n.png: test loss at theta_K (mean, min-max over seeds) against n, a line per H,
    with the least-squares slope per H and the curve c/(gamma^2 n) (gamma = mean NTK margin).
  * path.png (when evaluated at several k): along the GD path, ||theta_k - theta_0|| against
    log(k)/gamma (the theory's radius), sqrt(H) lambda_min(Hessian)/L and eta lambda_max (the
    stability edge 2 drawn), mean over seeds per H, for the first (n, eta) of the sweep.
  * test_loss_vs_n.png also has the generalization gap (test loss - train loss at theta_K); a row
    per step size, and no figure when the sweep has one n.
  * ntk_margin_vs_H.png: NTK margin at theta_0, mean +- std over seeds against H (left), and
    margins divided by the feature radius against the linear baselines (right).
The init scheme is written in every title: numbers under "zero_plus_step" (identical heads)
measure a learning-rate effect of H, not width.
"""

from __future__ import annotations

import math
import sys

import numpy as np

from mhjax.io.curves import train_window
from mhjax.io.results import write_text
from mhjax.io.workdir import Workdir

SUMMARY = "mixture_summary.md"


class NothingToDraw(Exception):
    """The records hold no data for this figure (it is left out without a message)."""


def group_by(records, keys) -> dict:
    """{tuple of the records' values at ``keys``: records}, sorted by key (None last)."""
    out = {}
    for r in records:
        out.setdefault(tuple(r.get(k) for k in keys), []).append(r)
    return dict(sorted(out.items(), key=lambda kv: tuple((v is None, v) for v in kv[0])))


def _values(records, field):
    values = [r.get(field) for r in records]
    return np.array([v for v in values if isinstance(v, (int, float)) and math.isfinite(v)], float)


def _mean(records, field):
    values = _values(records, field)
    return float(values.mean()) if values.size else float("nan")


def _mean_std(records, field) -> str:
    values = _values(records, field)
    if not values.size:
        return "-"
    return f"{values.mean():.3g} ± {values.std():.2g}" if values.size > 1 else f"{values[0]:.3g}"


def _fmt(value) -> str:
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value:.4g}"


SUMMARY_COLUMNS = (
    ("ntk_margin", "NTK margin at theta_0"),
    ("ntk_margin_normalized", "NTK margin / radius"),
    ("linear_margin", "linear margin (flat)"),
    ("linear_margin_mean", "linear margin (mean token)"),
    ("train_loss_eval", "train loss"),
    ("test_loss", "test loss"),
    ("test_accuracy", "test acc"),
    ("param_distance", "dist(theta_K, theta_0)"),
    ("head_spread", "head spread"),
    ("grad_norm_over_loss", "norm(grad L) / L"),
    ("min_hessian_eig_over_loss_sqrtH", "sqrt(H) lambda_min / L"),
    ("step_times_hessian_max", "eta lambda_max"),
)


def rate_rows(records) -> list[tuple]:
    """(n, eta, H, seeds, slope, product, L(theta_K), eta lambda_max), each 'mean ± std', per (n, eta, H)."""
    rows = []
    for (n, eta, h), group in group_by(records, ("num_train", "step_size", "heads")).items():
        rows.append(
            (
                n,
                eta,
                h,
                len(group),
                _mean_std(group, "loss_slope"),
                _mean_std(group, "margin_loss_product"),
                _mean_std(group, "train_loss_eval"),
                _mean_std(group, "step_times_hessian_max"),
            )
        )
    return rows


def flat_threshold(records, slope_tol: float = 0.2) -> dict:
    """{(n, eta): the smallest H from which on every larger H has mean loss_slope within
    ``slope_tol`` of -1, or None}: where the measured rate matches the theory's 1/K."""
    out = {}
    for (n, eta), group in group_by(records, ("num_train", "step_size")).items():
        by_h = group_by(group, ("heads",))
        ok = [(h, abs(_mean(v, "loss_slope") + 1) <= slope_tol) for (h,), v in by_h.items()]
        found = None
        for pos, (h, _) in enumerate(ok):
            if all(flag for _, flag in ok[pos:]):
                found = h
                break
        out[(n, eta)] = found
    return out


def _curves(workdir: Workdir, name: str, tags) -> dict:
    """A member's TensorBoard curves ({} when it has no TensorBoard run)."""
    return workdir.curves(name, tags) if workdir.has_curves(name) else {}


def edge_crossings(workdir: Workdir, records: list[dict]) -> dict:
    """{(eta, H): the last evaluated step k with eta lambda_max(theta_k) > 2 in any seed}, from
    the members' eval/step_times_hessian_max curves (empty without evaluations)."""
    tag = "eval/step_times_hessian_max"
    out = {}
    for r in records:
        steps, values = _curves(workdir, r["name"], [tag]).get(tag, (np.zeros(0), np.zeros(0)))
        above = steps[values > 2]
        if above.size:
            key = (r.get("step_size"), r.get("heads"))
            out[key] = max(out.get(key, 0), int(above.max()))
    return dict(sorted(out.items()))


def summary_markdown(records: list[dict], init: str = "?", crossings: dict | None = None) -> str:
    total = max((r.get("steps") or 0) for r in records) if records else 0
    lines = [
        "# Tokenized mixture: one-layer multi-head attention under GD",
        "",
        f"theta_0: init scheme `{init}`; K = {total} GD steps. Means over seeds. Margins: certified lower",
        "bounds (simplex dual); a value <= 0 means the features were not certified separable. `sep` counts",
        "the seeds whose NTK features at theta_0 are separable. Losses, accuracies, head spread and the",
        "Hessian columns at theta_K; eta lambda_max > 2 means the step is above GD's stability edge.",
        "",
    ]
    header = ["n", "eta", "H", "seeds", "sep"] + [title for _, title in SUMMARY_COLUMNS]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (n, eta, h), group in group_by(records, ("num_train", "step_size", "heads")).items():
        sep = sum(1 for r in group if (r.get("ntk_margin") or 0) > 0)
        row = [str(n), _fmt(eta), str(h), str(len(group)), f"{sep}/{len(group)}"]
        row += [_fmt(_mean(group, field)) for field, _ in SUMMARY_COLUMNS]
        lines.append("| " + " | ".join(row) + " |")
    if any("loss_slope" in r for r in records):
        lines += [
            "",
            "## Training rate",
            "",
            "slope: least-squares slope of log L(theta_k) against log k over k in [K/10, K] (theory: -1).",
            "product: ntk_margin^2 * eta * K * L(theta_K) (theory: of order one and flat in K once H is past",
            "a threshold). Mean ± std over seeds. Where L(theta_K) is below ~1e-6 the GD updates are at",
            "float32 rounding level (a step changes the parameters by ~eta L |features|), so a flat tail",
            "there is a precision floor, not a rate. eta lambda_max at theta_K (> 2: above GD's stability edge).",
            "",
            "| n | eta | H | seeds | loss slope | margin^2 eta K L | L(theta_K) | eta lambda_max |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for n, eta, h, count, slope, product, loss, sharp in rate_rows(records):
            lines.append(f"| {n} | {_fmt(eta)} | {h} | {count} | {slope} | {product} | {loss} | {sharp} |")
        lines += [""]
        for (n, eta), h in flat_threshold(records).items():
            found = f"H >= {h}" if h is not None else "no H in the sweep"
            lines.append(f"- n={n}, eta={_fmt(eta)}: slope within 0.2 of -1 for {found}.")
    unstable = sorted(
        {(r.get("step_size"), r.get("heads")) for r in records if (r.get("step_times_hessian_max") or 0) > 2}
    )
    if unstable:
        lines += [
            "",
            "Above the stability edge (eta lambda_max(theta_K) > 2): "
            + ", ".join(f"eta={_fmt(e)} H={h}" for e, h in unstable)
            + ".",
        ]
    if crossings:
        lines += [
            "",
            "Above the stability edge along the path (eta lambda_max(theta_k) > 2 at an evaluated k; the",
            "last such k): " + ", ".join(f"eta={_fmt(e)} H={h} (k={k})" for (e, h), k in crossings.items()) + ".",
        ]
    return "\n".join(lines) + "\n"


def write_figures_and_summary(
    workdir: Workdir, records: list[dict], chunk_steps: int = 1, log=None, init: str = "?"
) -> list[str]:
    """loss_vs_K.png, test_loss_vs_n.png, ntk_margin_vs_H.png and mixture_summary.md; returns
    the paths written. A figure that fails is skipped with a message (results are already saved).
    The members' TensorBoard runs are read once (``workdir`` keeps them)."""
    log = log or (lambda m: print(m, file=sys.stderr))
    written = []
    path = workdir.file(SUMMARY)
    write_text(path, summary_markdown(records, init, edge_crossings(workdir, records)))
    written.append(path)
    for filename, draw in (
        ("loss_vs_K.png", lambda fig: _plot_loss_vs_K(fig, workdir, records, chunk_steps, init)),
        ("test_loss_vs_n.png", lambda fig: _plot_test_loss_vs_n(fig, records, init)),
        ("ntk_margin_vs_H.png", lambda fig: _plot_margin_vs_H(fig, records, init)),
        ("path.png", lambda fig: _plot_path(fig, workdir, records, init)),
    ):
        try:
            from matplotlib.figure import Figure  # slow import: only when drawing

            fig = Figure(figsize=(11, 4.2), layout="constrained")
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
    """(steps, values) of a member's train loss: the exact recorded curve, else TensorBoard's
    train/loss (at step s the mean of L(theta_k), k = s-w..s-1 for the trainer's window w, placed
    at s - (w+1)/2)."""
    curve = record.get("loss_curve")
    if curve:
        values = np.array([np.nan if v is None else v for v in curve["values"]], float)
        return np.asarray(curve["steps"], float), values
    found = _curves(workdir, record["name"], ["train/loss"]).get("train/loss")
    if found is None:
        return np.zeros(0), np.zeros(0)
    return found[0] - (train_window(chunk_steps) + 1) / 2, found[1]


def _plot_loss_vs_K(fig, workdir, records, chunk_steps, init):
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
            steps = curves[0][0][:length]
            values = np.mean([c[1][:length] for c in curves], axis=0)
            keep = (steps > 0) & np.isfinite(values) & (values > 0)
            ax.loglog(steps[keep], values[keep], color=colors[h], label=f"H={h}")
            if keep.any() and anchor is None:
                anchor = (steps[keep][0], values[keep][0], steps[keep][-1])
        if anchor is not None:
            k0, l0, k1 = anchor
            ks = np.geomspace(k0, k1, 20)
            ax.loglog(ks, l0 * k0 / ks, "k--", lw=1, label="1/K")
        ax.set_title(f"n={n}, eta={eta:g}, init={init}", fontsize=9)
        ax.set_xlabel("GD step k")
        ax.set_ylabel("train loss (mean over seeds)")
        ax.legend(fontsize=7)


def _plot_test_loss_vs_n(fig, records, init):
    if len({r["num_train"] for r in records}) < 2:
        raise NothingToDraw("one training-set size: no curve against n")
    records = [dict(r, generalization_gap=_gap(r)) for r in records]
    panels = group_by(records, ("step_size",))
    axes = fig.subplots(len(panels), 2, squeeze=False)
    fig.set_size_inches(11, 4.2 * len(panels))  # a row per step size: panels stay readable
    for j, ((eta,), group) in enumerate(panels.items()):
        _draw_vs_n(axes[j, 0], group, "test_loss", f"test loss at theta_K, eta={eta:g}, init={init}", records)
        _draw_vs_n(axes[j, 1], group, "generalization_gap", f"test - train loss at theta_K, eta={eta:g}", records)


def _gap(record):
    test, train = record.get("test_loss"), record.get("train_loss_eval")
    return test - train if isinstance(test, float) and isinstance(train, float) else None


def _draw_vs_n(ax, group, field, title, records):
    """``field`` at theta_K (mean, min-max over seeds) against n, a line per H with its fitted
    slope; the largest H also gets c/(gamma^2 n) with gamma its mean NTK margin per n."""
    colors = _colors(r["heads"] for r in records)
    heads = sorted(colors)
    for (h,), members in group_by(group, ("heads",)).items():
        nudge = 1.0 + 0.015 * (heads.index(h) - (len(heads) - 1) / 2)  # keep error bars apart
        by_n = group_by(members, ("num_train",))
        ns = np.array([k[0] for k in by_n], dtype=float)
        vals = [_values(v, field) for v in by_n.values()]
        mean = np.array([v.mean() if v.size else np.nan for v in vals])
        lo = np.array([v.min() if v.size else np.nan for v in vals])
        hi = np.array([v.max() if v.size else np.nan for v in vals])
        label = f"H={h}"
        ok = np.isfinite(mean) & (mean > 0)
        if ok.sum() >= 2:
            label += f" (slope {fitted_slope(ns[ok], mean[ok]):.2f})"
        ax.errorbar(ns * nudge, mean, yerr=[mean - lo, hi - mean], color=colors[h], marker="o", capsize=2, label=label)
        gamma = np.array([_mean(v, "ntk_margin") for v in by_n.values()])
        if h == heads[-1] and np.all(gamma > 0) and ok.any():
            ref = 1.0 / (gamma**2 * ns)
            ax.plot(ns, ref * mean[ok][0] / ref[ok][0], "k--", lw=1, label="1/(gamma^2 n), scaled to the first point")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("training set size n")
    ax.set_ylabel(f"{field} (mean, min-max over seeds)")
    ax.legend(fontsize=7)


def fitted_slope(x, y) -> float:
    """Least-squares slope of log y against log x."""
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def _plot_margin_vs_H(fig, records, init):
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
        ax.set_xscale("log", base=2)
        ax.set_xlabel("heads H")
        ax.legend(fontsize=7)
    left.set_ylabel("NTK margin at theta_0 (mean ± std over seeds)")
    left.set_title(f"NTK margin vs H, init={init} (<= 0: not separable)", fontsize=9)
    right.set_ylabel("margin / max feature norm")
    right.set_title("scale-free margins: NTK vs linear on raw inputs", fontsize=9)


def _draw_margins(left, right, n, eta, group):
    """One line per (n[, eta]): the NTK margin (left) and the scale-free margins (right)."""
    by_h = group_by(group, ("heads",))
    hs = np.array([h[0] for h in by_h], dtype=float)
    stats = [_values(v, "ntk_margin") for v in by_h.values()]
    mean = np.array([s.mean() if s.size else np.nan for s in stats])
    std = np.array([s.std() if s.size else np.nan for s in stats])
    normed = np.array([_mean(v, "ntk_margin_normalized") for v in by_h.values()])
    label = f"n={n}" if eta is None else f"n={n}, eta={eta:g}"
    line = left.errorbar(hs, mean, yerr=std, marker="o", capsize=3, label=label)
    color = line[0].get_color()
    right.plot(hs, normed, marker="o", color=color, label=f"NTK, {label}")
    right.axhline(_mean(group, "linear_margin_normalized"), ls="--", color=color, lw=1, label=f"linear (flat), n={n}")
    right.axhline(
        _mean(group, "linear_margin_mean_normalized"),
        ls=":",
        color=color,
        lw=1,
        label=f"linear (mean token), n={n}",
    )


PATH_TAGS = ("eval/distance_from_init", "eval/min_hessian_eig_over_loss_sqrtH", "eval/step_times_hessian_max")


def _plot_path(fig, workdir, records, init):
    (n, eta), group = next(iter(group_by(records, ("num_train", "step_size")).items()))
    curves = {r["name"]: _curves(workdir, r["name"], PATH_TAGS) for r in group}
    if all(len(curves[r["name"]].get(PATH_TAGS[0], ((),))[0]) < 3 for r in group):
        raise NothingToDraw("fewer than 3 evaluations along the path (set train.eval_points)")
    colors = _colors(r["heads"] for r in records)
    axes = fig.subplots(1, 3)
    for (h,), members in group_by(group, ("heads",)).items():
        found = [curves[r["name"]] for r in members if all(t in curves[r["name"]] for t in PATH_TAGS)]
        if not found:
            continue
        length = min(c[PATH_TAGS[0]][0].size for c in found)
        steps = found[0][PATH_TAGS[0]][0][:length].astype(float)
        mean = {t: np.mean([c[t][1][:length] for c in found], axis=0) for t in PATH_TAGS}
        gamma = _mean(members, "ntk_margin")
        keep = steps > 0
        if gamma > 0:
            axes[0].plot(
                np.log(steps[keep]) / gamma, mean[PATH_TAGS[0]][keep], marker=".", color=colors[h], label=f"H={h}"
            )
        axes[1].plot(np.maximum(steps, 0.5), mean[PATH_TAGS[1]], marker=".", color=colors[h], label=f"H={h}")
        axes[2].plot(np.maximum(steps, 0.5), mean[PATH_TAGS[2]], marker=".", color=colors[h], label=f"H={h}")
    axes[2].axhline(2.0, color="k", ls="--", lw=1, label="stability edge 2")
    axes[0].set_xlabel("log(k) / gamma (gamma: NTK margin at theta_0)")
    axes[0].set_ylabel("||theta_k - theta_0||")
    axes[0].set_title(f"distance from theta_0, n={n}, eta={eta:g}, init={init}", fontsize=9)
    for ax, label in ((axes[1], "sqrt(H) lambda_min / L"), (axes[2], "eta lambda_max")):
        ax.set_xscale("log")
        ax.set_xlabel("GD step k (k=0 drawn at 0.5)")
        ax.set_ylabel(label)
        ax.set_title(label + " along the path (mean over seeds)", fontsize=9)
    for ax in axes:
        ax.legend(fontsize=7)
