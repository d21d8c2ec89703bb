"""The init-scale comparison of a mixture sweep over ``sweep.init_tau`` (configs/mixture_init.py).

* test_accuracy_vs_H.png: test accuracy at theta_K (mean, min-max over seeds) against H, one
  line per tau, a panel per n (and eta when several).
* mixture_init.md: per (n, eta, tau, H), means over seeds of test accuracy and loss, train loss,
  head_spread at theta_0 and theta_K, the NTK margin at theta_0 and the scale-free margin
  (NTK margin / the largest NTK feature norm), and the rule configs/mixture.py's default follows:
  the taus under which heads differ (head_spread > 0 for every H >= 2) and the largest H is at
  least as accurate as one head at the largest n (mean, within 0.01).
"""

from __future__ import annotations

import math
import sys

import numpy as np

from mhjax.io.results import write_text
from mhjax.io.workdir import Workdir
from mhjax.plotting.mixture_style import log_axes
from mhjax.plotting.mixture_summary import fmt as _fmt
from mhjax.plotting.mixture_summary import group_by
from mhjax.plotting.mixture_summary import mean_of as _mean
from mhjax.plotting.mixture_summary import values_of as _values

TABLE, FIGURE = "mixture_init.md", "test_accuracy_vs_H.png"

COLUMNS = (
    ("test_accuracy", "test acc"),
    ("test_loss", "test loss"),
    ("train_loss_eval", "train loss"),
    ("head_spread_init", "head spread theta_0"),
    ("head_spread", "head spread theta_K"),
    ("ntk_margin", "NTK margin"),
    ("ntk_margin_normalized", "NTK margin / radius"),
)
TOLERANCE = 0.01  # seed noise allowed between the largest H's and one head's mean test accuracy
FLOOR = 0.95  # the largest H's mean test accuracy must also reach this (issue 25's done-when)


def taus(records) -> list[float]:
    return sorted({r["init_tau"] for r in records if r.get("init_tau") is not None})


def qualifying_taus(records, tolerance: float = TOLERANCE) -> dict:
    """{tau: (heads differ for every H >= 2, mean accuracy of the largest H, of H = 1)} at the
    largest n (first eta); a tau qualifies when heads differ and largest >= one head - tolerance."""
    n_max = max(r["num_train"] for r in records)
    eta = min(r["step_size"] for r in records)
    out = {}
    for (tau,), group in group_by(
        [r for r in records if r["num_train"] == n_max and r["step_size"] == eta], ("init_tau",)
    ).items():
        h_max = max(r["heads"] for r in group)
        differ = all((r.get("head_spread") or 0) > 0 for r in group if r["heads"] >= 2)
        largest = _mean([r for r in group if r["heads"] == h_max], "test_accuracy")
        one = _mean([r for r in group if r["heads"] == 1], "test_accuracy")
        out[tau] = (differ, largest, one)
    return out


def init_table_markdown(records, scheme: str = "?") -> str:
    total = max((r.get("steps") or 0) for r in records)
    lines = [
        "# Tokenized mixture: the init scale tau against H",
        "",
        f"theta_0: init scheme `{scheme}` with tau = sweep.init_tau (members differing only in tau share their",
        f"random directions); K = {total} GD steps. Means over seeds; test on fresh examples. NTK margin / radius:",
        "the margin divided by the largest NTK feature norm at theta_0 (scale-free: comparable across tau).",
        "",
    ]
    header = ["n", "eta", "tau", "H", "seeds"] + [title for _, title in COLUMNS]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (n, eta, tau, h), group in group_by(records, ("num_train", "step_size", "init_tau", "heads")).items():
        row = [str(n), _fmt(eta), f"{tau:g}", str(h), str(len(group))]
        row += [_fmt(_mean(group, field)) for field, _ in COLUMNS]
        lines.append("| " + " | ".join(row) + " |")
    n_max = max(r["num_train"] for r in records)
    lines += ["", f"At n = {n_max}: heads differ (head_spread > 0 for every H >= 2) and the largest H's mean test"]
    lines += [f"accuracy is at least one head's minus {TOLERANCE} and at least {FLOOR}:", ""]
    for tau, (differ, largest, one) in qualifying_taus(records).items():
        ok = differ and math.isfinite(largest) and math.isfinite(one) and largest >= max(one - TOLERANCE, FLOOR)
        lines.append(
            f"- tau = {tau:g}: heads differ: {'yes' if differ else 'no'}; largest H {largest:.3f} vs one head "
            f"{one:.3f}: {'qualifies' if ok else 'does not qualify'}"
        )
    return "\n".join(lines) + "\n"


def plot_accuracy_vs_H(fig, records, scheme: str = "?"):
    panels = group_by(records, ("num_train", "step_size"))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    several_eta = len({r["step_size"] for r in records}) > 1
    from matplotlib import colormaps

    cmap, values = colormaps["plasma"], taus(records)
    colours = {t: cmap(0.85 * i / max(len(values) - 1, 1)) for i, t in enumerate(values)}
    for ax, ((n, eta), group) in zip(axes, panels.items()):
        for (tau,), members in group_by(group, ("init_tau",)).items():
            by_h = group_by(members, ("heads",))
            hs = np.array([k[0] for k in by_h], float)
            vals = [_values(v, "test_accuracy") for v in by_h.values()]
            mean = np.array([v.mean() if v.size else np.nan for v in vals])
            lo = np.array([v.min() if v.size else np.nan for v in vals])
            hi = np.array([v.max() if v.size else np.nan for v in vals])
            ax.errorbar(
                hs, mean, yerr=[mean - lo, hi - mean], marker="o", capsize=2, color=colours[tau], label=f"tau={tau:g}"
            )
        log_axes(ax, y=False, base=2)
        ax.set_xlabel("heads H")
        ax.set_ylabel("test accuracy at theta_K (mean, min-max over seeds)")
        ax.set_title(f"n={n}" + (f", eta={eta:g}" if several_eta else "") + f", init={scheme}", fontsize=9)
        ax.legend(fontsize=7)


def write_init_comparison(workdir, records: list[dict], scheme: str = "?", log=None) -> list[str]:
    """mixture_init.md and test_accuracy_vs_H.png in ``workdir`` (a Workdir or a path); returns the
    paths written. A failing figure is skipped with a message, as in plotting/mixture.py."""
    workdir = Workdir.of(workdir)
    path = workdir.file(TABLE)
    write_text(path, init_table_markdown(records, scheme))
    try:
        from matplotlib.figure import Figure  # slow import: only when drawing

        panels = len(group_by(records, ("num_train", "step_size")))
        fig = Figure(figsize=(5.5 * panels, 4.2), layout="constrained")
        plot_accuracy_vs_H(fig, records, scheme)
        figure = workdir.file(FIGURE)
        fig.savefig(figure, dpi=110)
    except Exception as exc:  # a figure must never cost a finished run
        (log or (lambda m: print(m, file=sys.stderr)))(f"mixture: {FIGURE} skipped ({type(exc).__name__}: {exc})")
        return [path]
    return [path, figure]
