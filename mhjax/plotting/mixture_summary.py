"""mixture_summary.md of a mixture sweep, and the record helpers its figures share.

The table: per (n, eta, H), means over seeds of the margins, losses, accuracies and Hessian
quantities. The training rate section: each H's slope of log L against log S_k over the
recorded k in [a K, b K] (``analysis.slope_window`` (a, b), the last decade by default; S_k =
sum_{j<k} eta_j, the clock of GD's rate for any step rule; = eta k for a constant step) with the
fit's standard error and the steps it used, and gamma^2 S_K L(theta_K), mean ± std over seeds;
the members without a slope and why; rows whose L(theta_K) is below PRECISION_FLOOR flagged; and
the rate verdict, which is one-sided: the theory bounds the loss from above by c / (gamma^2 S_K),
so a slope at or below RATE_SLOPE (-0.8) agrees with it and a faster decay does not contradict
it. The verdict names the H that meet it and those that do not, and the smallest H from which
every larger H meets it (``rate_threshold``). The verdict and the quantities that
assume an exponential tail of the loss are left out for a loss without one (the squared loss),
and the summary says so. Diverged members (train/status.py) are left out of every mean, slope
and verdict, and the summary names them and says how many.
"""

from __future__ import annotations

import math

import numpy as np

RATE_SLOPE = -0.8  # a slope at or below this agrees with the theory's 1/S_K upper bound
PRECISION_FLOOR = 1e-6  # L(theta_K) below it: GD's updates are at float32 rounding level (a flat tail is no rate)
TAIL_FIELDS = ("margin_loss_product", "grad_norm_over_loss", "min_hessian_eig_over_loss_sqrtH")


def group_by(records, keys) -> dict:
    """{tuple of the records' values at ``keys``: records}, sorted by key (None last)."""
    out = {}
    for r in records:
        out.setdefault(tuple(r.get(k) for k in keys), []).append(r)
    return dict(sorted(out.items(), key=lambda kv: tuple((v is None, v) for v in kv[0])))


def values_of(records, field):
    values = [r.get(field) for r in records]
    return np.array([v for v in values if isinstance(v, (int, float)) and math.isfinite(v)], float)


def mean_of(records, field):
    values = values_of(records, field)
    return float(values.mean()) if values.size else float("nan")


def mean_std(records, field) -> str:
    values = values_of(records, field)
    if not values.size:
        return "-"
    return f"{values.mean():.3g} ± {values.std():.2g}" if values.size > 1 else f"{values[0]:.3g}"


def fmt(value) -> str:
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


def slope_text(group) -> str:
    """'mean ± std (s.e. x)' of the seeds' slopes, x the largest of their fits' standard errors."""
    text = mean_std(group, "loss_slope")
    errors = values_of(group, "loss_slope_stderr")
    if text == "-" or not errors.size:
        return text
    return f"{text} (s.e. {'up to ' if errors.size > 1 else ''}{errors.max():.2g})"


def window_text(group) -> str:
    """The fitted steps of the group's seeds: 'first-last (points)', or each distinct one."""
    found = sorted(
        {(tuple(r["loss_slope_window"]), r.get("loss_slope_points")) for r in group if r.get("loss_slope_window")}
    )
    return ", ".join(f"{a}-{b} ({count})" for (a, b), count in found) or "-"


def below_floor(group) -> bool:
    """Whether a seed's L(theta_K) is below PRECISION_FLOOR (0 included)."""
    return any(v < PRECISION_FLOOR for v in values_of(group, "train_loss_eval"))


def rate_rows(records) -> list[tuple]:
    """(n, eta, H, seeds, slope (s.e.), fitted steps, product, L(theta_K), eta lambda_max) per
    (n, eta, H), each 'mean ± std' over seeds; L(theta_K) marked '*' below PRECISION_FLOOR."""
    rows = []
    for (n, eta, h), group in group_by(records, ("num_train", "step_size", "heads")).items():
        rows.append(
            (
                n,
                eta,
                h,
                len(group),
                slope_text(group),
                window_text(group),
                mean_std(group, "margin_loss_product"),
                mean_std(group, "train_loss_eval") + (" *" if below_floor(group) else ""),
                mean_std(group, "step_times_hessian_max"),
            )
        )
    return rows


def rate_threshold(records, slope: float = RATE_SLOPE) -> dict:
    """{(n, eta): the smallest H from which on every larger H has mean loss_slope <= ``slope``,
    or None}: where the measured rate is at least the theory's 1/S_K (one-sided: the theory gives
    an upper bound on the loss, so decaying faster agrees with it). An H without a slope does not
    meet it."""
    out = {}
    for (n, eta), group in group_by(records, ("num_train", "step_size")).items():
        by_h = group_by(group, ("heads",))
        ok = [(h, mean_of(v, "loss_slope") <= slope) for (h,), v in by_h.items()]
        found = None
        for pos, (h, _) in enumerate(ok):
            if all(flag for _, flag in ok[pos:]):
                found = h
                break
        out[(n, eta)] = found
    return out


def verdict_lines(records, slope: float = RATE_SLOPE) -> list[str]:
    """Per (n, eta): the H whose mean slope meets ``slope`` and those that do not (with their
    slopes; '*': L(theta_K) below PRECISION_FLOOR in a seed), the H without a slope, and the
    smallest H from which every larger H meets it (``rate_threshold``), in those words."""
    lines, threshold = [], rate_threshold(records, slope)
    for (n, eta), group in group_by(records, ("num_train", "step_size")).items():
        meet, fail, none = [], [], []
        for (h,), members in group_by(group, ("heads",)).items():
            value = mean_of(members, "loss_slope")
            if not math.isfinite(value):
                none.append(f"{h}")
                continue
            (meet if value <= slope else fail).append(f"{h} ({value:.2f}{'*' if below_floor(members) else ''})")
        parts = [f"met at H = {', '.join(meet)}" if meet else "met at no H"]
        parts += [f"not at H = {', '.join(fail)}"] if fail else []
        parts += [f"no slope at H = {', '.join(none)}"] if none else []
        largest = max(h for (h,) in group_by(group, ("heads",)))
        found = threshold[(n, eta)]
        tail = f"H = {found}" if found is not None else f"none (H = {largest} does not meet it)"
        lines.append(
            f"- n={n}, eta={fmt(eta)}: slope <= {slope} (at least the 1/S_K rate) {'; '.join(parts)}. "
            f"Smallest H from which every larger H meets it: {tail}."
        )
    return lines


def rate_section(records, tail: bool, loss: str, window=(0.1, 1.0)) -> list[str]:
    """The '## Training rate' section (records: the kept members, those with loss_slope)."""
    a, b = (float(v) for v in window)
    span = f"[{a:g} K, {b:g} K]" if b < 1 else (f"[{a:g} K, K]" if a > 0 else "[1, K]")
    lines = [
        "",
        "## Training rate",
        "",
        "slope: least-squares slope of log L(theta_k) against log S_k, S_k = sum_{j<k} eta_j (= eta k for a",
        f"constant step), over the recorded k in {span} (analysis.slope_window = ({a:g}, {b:g})), with the fit's",
        "standard error (s.e.; the largest over seeds) and the steps it used (first-last (points)) (theory:",
        "L <= c / (gamma^2 S_K), so a slope <= -1 up to noise). No slope where the loss reached 0 inside the",
        "window or fewer than 3 points lie in it (listed below).",
        "product: ntk_margin^2 * S_K * L(theta_K) (theory: of order one and flat in K once H is past a",
        "threshold; none where L(theta_K) is 0). Mean ± std over seeds.",
        "Where L(theta_K) is below 1e-6 the GD updates are at float32 rounding level, so a flat tail",
        "there is a precision floor, not a rate: such rows are marked `*`. eta_K lambda_max at theta_K (> 2: above",
        "GD's stability edge).",
        "",
        "| n | eta | H | seeds | loss slope | fitted k (points) | margin^2 sum(eta) L | L(theta_K) | eta lambda_max |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n, eta, h, count, slope, steps, product, value, sharp in rate_rows(records):
        lines.append(f"| {n} | {fmt(eta)} | {h} | {count} | {slope} | {steps} | {product} | {value} | {sharp} |")
    lines += [""]
    without = [r for r in records if "loss_slope" in r and r.get("loss_slope") is None]
    if without:
        lines += [f"No slope for {len(without)} member(s):", ""]
        lines += [f"- {r['name']}: {r.get('loss_slope_note') or 'no slope'}" for r in without] + [""]
    if not tail:
        return lines + [f"- No rate verdict: the 1/S_K bound assumes a loss with an exponential tail, not `{loss}`."]
    lines += verdict_lines(records)
    if any(below_floor(g) for g in group_by(records, ("num_train", "step_size", "heads")).values()):
        lines += ["", "`*`: L(theta_K) < 1e-6 in a seed: that slope may read float32's floor, not a rate."]
    return lines


def edge_crossings(curves_of, records: list[dict]) -> dict:
    """{(eta, H): the last evaluated step k with eta lambda_max(theta_k) > 2 in any seed}, from
    the members' eval/step_times_hessian_max curves (``curves_of(name, tags)``; empty without
    evaluations)."""
    tag = "eval/step_times_hessian_max"
    out = {}
    for r in records:
        steps, values = curves_of(r["name"], [tag]).get(tag, (np.zeros(0), np.zeros(0)))
        above = steps[values > 2]
        if above.size:
            key = (r.get("step_size"), r.get("heads"))
            out[key] = max(out.get(key, 0), int(above.max()))
    return dict(sorted(out.items()))


def kept(records: list[dict]) -> list[dict]:
    """The records that enter means, slopes and verdicts: every member that did not diverge."""
    return [r for r in records if r.get("status", "ok") != "diverged"]


def summary_markdown(
    records: list[dict],
    init: str = "?",
    crossings: dict | None = None,
    loss: str = "logistic",
    tail: bool = True,
    generator: str | None = None,
    slope_window=(0.1, 1.0),
) -> str:
    """The summary, titled by the data generator (config.data.generator) it was trained on;
    ``generator`` None: the built-in tokenized mixture; ``slope_window``: analysis.slope_window."""
    total = max((r.get("steps") or 0) for r in records) if records else 0
    diverged = [r for r in records if r.get("status", "ok") == "diverged"]
    records = kept(records)
    data = f"Mixture data from generator `{generator}`" if generator else "Tokenized mixture"
    lines = [
        f"# {data}: one-layer multi-head attention under GD",
        "",
        f"theta_0: init scheme `{init}`; loss `{loss}`; K = {total} GD steps. Means over seeds. Margins: certified",
        "lower bounds (simplex dual); a value <= 0 means the features were not certified separable, `-` that",
        "the margin could not be computed. `sep` counts the seeds whose NTK features at theta_0 are separable.",
        "Losses, accuracies, head spread and the Hessian columns at theta_K; eta lambda_max > 2 means the step",
        "is above GD's stability edge.",
        "",
    ]
    if diverged:
        lines += [
            f"**{len(diverged)} of {len(diverged) + len(records)} members diverged and are left out of every mean,"
            " slope and verdict below:**",
            "",
            *[f"- {r['name']}: {r.get('diverged_reason') or 'diverged'}" for r in diverged],
            "",
        ]
    if not tail:
        lines += [
            f"The `{loss}` loss has no exponential tail: gamma^2 S_K L, the 1/S_K rate verdict, norm(grad L) / L and",
            "sqrt(H) lambda_min / L assume one and are left out (`-`).",
            "",
        ]
    header = ["n", "eta", "H", "seeds", "sep"] + [title for _, title in SUMMARY_COLUMNS]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (n, eta, h), group in group_by(records, ("num_train", "step_size", "heads")).items():
        sep = sum(1 for r in group if (r.get("ntk_margin") or 0) > 0)
        row = [str(n), fmt(eta), str(h), str(len(group)), f"{sep}/{len(group)}"]
        row += [fmt(mean_of(group, field)) for field, _ in SUMMARY_COLUMNS]
        lines.append("| " + " | ".join(row) + " |")
    if any("loss_slope" in r for r in records):
        lines += rate_section(records, tail, loss, slope_window)
    unstable = sorted(
        {(r.get("step_size"), r.get("heads")) for r in records if (r.get("step_times_hessian_max") or 0) > 2}
    )
    if unstable:
        lines += [
            "",
            "Above the stability edge (eta lambda_max(theta_K) > 2): "
            + ", ".join(f"eta={fmt(e)} H={h}" for e, h in unstable)
            + ".",
        ]
    if crossings:
        lines += [
            "",
            "Above the stability edge along the path (eta lambda_max(theta_k) > 2 at an evaluated k; the",
            "last such k): " + ", ".join(f"eta={fmt(e)} H={h} (k={k})" for (e, h), k in crossings.items()) + ".",
        ]
    return "\n".join(lines) + "\n"
