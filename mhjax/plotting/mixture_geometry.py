"""The mixture figures of the geometry the theory speaks of (plotting/mixture.py writes them):
* ntk_margin_vs_H.png: the NTK margin at theta_0 against H, and the scale-free margins against
  the linear baselines;
* path.png: along the GD path, the distance from theta_0 against log(k)/gamma and the Hessian's
  sqrt(H) lambda_min / L and eta lambda_max (the stability edge 2).
"""

from __future__ import annotations

import numpy as np

from mhjax.plotting.curves import MARKERS, line_styles
from mhjax.plotting.mixture_style import NothingToDraw, log_axes, member_curves, readable_ticks
from mhjax.plotting.mixture_summary import group_by, mean_of, values_of


def plot_margin_vs_H(fig, records, style):
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


def plot_path(fig, workdir, records, style):
    """Every step size of the sweep's first n: a colour and a line style per eta (in order), a
    marker per H."""
    n = next(iter(group_by(records, ("num_train",))))[0]
    etas = group_by([r for r in records if r["num_train"] == n], ("step_size",))
    curves = {r["name"]: member_curves(workdir, r["name"], PATH_TAGS) for group in etas.values() for r in group}
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
