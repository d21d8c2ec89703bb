"""Per-member results of a mixture sweep computed once training is done (the NTK quantities of arXiv 2310.12680).

* ntk_margin (+ gap, radius, normalized): hard-margin SVM through the origin on the NTK
  features at theta_0 of the member's own H on its own n examples; linear_margin (flattened
  tokens) and linear_margin_mean (mean token) as baselines.
* param_distance = ||theta_K - theta_0||.
* head_spread: mean pairwise distance between the active heads' vectors (W_h, U_h) at
  theta_K divided by their mean norm (0 for H = 1; 0 exactly when every head is the same);
  head_spread_init: the same at theta_0.
* loss_curve {steps, values}: the recorded L(theta_k) with k = K appended; loss_slope: the
  least-squares slope of log L(theta_k) against log S_k, S_k = sum_{j<k} eta_j (the clock of
  GD's rate: the same slope as against log k for the constant step rule, where S_k = eta k), over
  the recorded k in [a K, b K] (``analysis.slope_window`` (a, b); (0.1, 1): the last decade), with
  loss_slope_stderr (the fit's standard error), loss_slope_window ([first, last] k fitted),
  loss_slope_points and loss_slope_note (why there is none: the loss reached 0 inside the window,
  fewer than 3 points, the member diverged; ``fit_loss_slope``).
* loss_zero_at_step: the first step k whose L(theta_k) is 0 or subnormal (at or below float32's
  smallest normal), read from every step's loss (train/records.py); null when it never was.
* train_loss: L(theta_K), the full-batch loss after the last step (it was L(theta_{K-1}), the
  last step's input, before; = train_loss_eval).
* K is the member's own K (``own_steps``: train.steps, or steps_per_example * n).
* margin_loss_product = ntk_margin^2 * S_K * L(theta_K) with S_K = sum_{k<K} eta_k (= eta K
  for the constant step rule; field ``step_sum``): the theory's training rate L ~ 1/(gamma^2 S_K)
  makes it of order one and flat in K. Null for a loss without an exponential tail (the squared
  loss), as are grad_norm_over_loss and min_hessian_eig_over_loss_sqrtH, and where L(theta_K) is 0
  (a product of 0 says nothing of the rate).
* Every rate or product of RATE_FIELDS is null for a diverged member (on the path: non-finite or
  above the factor at some step; or at theta_K): its numbers are not a rate.
* A margin that cannot be computed (a non-finite Gram) is null, never 0.
* status "diverged" (``diverged_reason``) when L(theta_K) > train.divergence_factor * L(theta_0)
  (0 = off), besides the trainer's check of every L(theta_k) on the way (train/status.py);
  ``initial_loss`` = L(theta_0).
* Everything above is at theta_K unless it says theta_0; the evaluation's fields (test_loss,
  hessian_*, step_times_hessian_max = eta_K lambda_max, ...) are at theta_K too.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from mhjax.analysis import ntk
from mhjax.experiments.mixture_config import setting, solver_settings
from mhjax.models import mixture_parts
from mhjax.train.records import LOSS_FLOOR  # L at or below it is 0 or subnormal: no log-rate is read there


def head_spread(params, head_mask):
    """Mean pairwise distance of the active heads' parameter vectors over their mean norm.

    params: {'W': (Hmax, d, d), 'U': (Hmax, ...)}; head_mask: (Hmax,) 0/1. Returns 0 for one
    active head (no pairs)."""
    heads = params["W"].shape[0]
    V = jnp.concatenate([params["W"].reshape(heads, -1), params["U"].reshape(heads, -1)], 1)
    m = head_mask.astype(V.dtype)
    # Direct differences, not |a|^2 + |b|^2 - 2<a, b>: identical heads must give exactly 0.
    dist = jnp.linalg.norm(V[:, None, :] - V[None, :, :], axis=-1)
    norms = jnp.linalg.norm(V, axis=-1)
    pairs = m[:, None] * m[None, :] * (1.0 - jnp.eye(m.shape[0], dtype=V.dtype))
    count = jnp.sum(m)
    mean_dist = jnp.sum(pairs * dist) / jnp.maximum(jnp.sum(pairs), 1.0)
    mean_norm = jnp.sum(m * norms) / jnp.maximum(count, 1.0)
    return jnp.where(count > 1, mean_dist / jnp.maximum(mean_norm, 1e-30), 0.0)


MIN_SLOPE_POINTS = 3  # a slope and its standard error need one degree of freedom
# Rates and products derived from a member's path: null for a diverged member (its numbers are not a rate).
RATE_FIELDS = (
    "loss_slope",
    "loss_slope_stderr",
    "margin_loss_product",
    "grad_norm_over_loss",
    "min_hessian_eig_over_loss_sqrtH",
    "step_times_hessian_max",
)


def slope_steps(total: int, window=(0.1, 1.0)) -> tuple[int, int]:
    """The steps [ceil(a K), floor(b K)] (k >= 1) of ``window`` (a, b), fractions of K = ``total``."""
    return max(1, math.ceil(window[0] * total - 1e-9)), math.floor(window[1] * total + 1e-9)


def fit_loss_slope(steps, values, total: int, clock=None, window=(0.1, 1.0), zero_at: int | None = None) -> dict:
    """The least-squares slope of log(loss) against log(clock) over the recorded k in ``window``
    (fractions (a, b) of K = ``total``, k >= 1; ``clock``: each step's S_k = sum_{j<k} eta_j,
    default k itself), as results fields: ``loss_slope``, ``loss_slope_stderr`` (the fit's
    standard error), ``loss_slope_window`` ([first, last] k fitted), ``loss_slope_points`` (how
    many) and ``loss_slope_note``. No slope (all null but the note) when a point in the window is
    0, subnormal (at or below LOSS_FLOOR) or not finite: a fit on what is left would not be over
    the window (the loss that reached 0 at step 51 gave a slope over [20, 49] of [20, 200]); nor
    from fewer than MIN_SLOPE_POINTS points. ``zero_at``: the first step whose loss reached 0, where
    known (the note names it rather than the first recorded point after it)."""
    steps = np.asarray(steps, float)
    values = np.array([math.nan if v is None else v for v in values], float)
    clock = steps if clock is None else np.asarray(clock, float)
    first, last = slope_steps(total, window)
    inside = (steps >= first) & (steps <= last) & (clock > 0)
    usable = inside & np.isfinite(values) & (values > LOSS_FLOOR)
    count, span = int(inside.sum()), f"[{first}, {last}]"
    out = dict(loss_slope=None, loss_slope_stderr=None, loss_slope_window=None, loss_slope_points=0)
    if usable.sum() < count:
        k = int(steps[inside & ~usable][0])
        if not np.isfinite(values[steps == k][0]):
            note = f"L(theta_k) is not finite at k = {k}"
        else:  # the step it first did, where every step's loss was read (zero_at), else the recorded point
            k = k if zero_at is None or not first <= zero_at <= k else int(zero_at)
            note = f"L(theta_k) reached 0 (at or below float32's smallest normal) at k = {k}"
        note += f", inside the slope window {span}: no slope from {int(usable.sum())} of its {count} recorded points"
        return dict(out, loss_slope_note=note)
    if count < MIN_SLOPE_POINTS:
        note = f"{count} recorded points in the slope window {span}, {MIN_SLOPE_POINTS} needed"
        return dict(out, loss_slope_note=f"{note} (more train.loss_points or a wider analysis.slope_window)")
    x, y = np.log(clock[usable]), np.log(values[usable])
    dx = x - x.mean()
    slope = float(np.sum(dx * (y - y.mean())) / np.sum(dx * dx))
    residuals = y - y.mean() - slope * dx
    stderr = float(np.sqrt(np.sum(residuals**2) / (count - 2) / np.sum(dx * dx)))
    fitted = steps[usable]
    return dict(
        loss_slope=slope,
        loss_slope_stderr=stderr,
        loss_slope_window=[int(fitted[0]), int(fitted[-1])],
        loss_slope_points=count,
        loss_slope_note=None,
    )


def loss_slope(steps, values, total: int, clock=None, window=(0.1, 1.0)) -> float:
    """``fit_loss_slope``'s slope alone, NaN where it gives none."""
    slope = fit_loss_slope(steps, values, total, clock, window)["loss_slope"]
    return math.nan if slope is None else slope


def _member_pieces(recipe, params_K, consts):
    """(NTK Gram at theta_0 over all max_train examples, ||theta_K - theta_0||, head spread at
    theta_K, L(theta_K), head spread at theta_0, L(theta_0)) of one member."""
    theta0 = recipe.init_params(consts)
    gram = ntk.ntk_gram(recipe.apply_single(consts), theta0, consts.X, chunk_size=min(64, recipe.max_train))
    distance = jnp.linalg.norm(ravel_pytree(params_K)[0] - ravel_pytree(theta0)[0])
    spread_init = head_spread(theta0, consts.head_mask)
    final, initial = recipe.train_loss(params_K, consts), recipe.train_loss(theta0, consts)
    return gram, distance, head_spread(params_K, consts.head_mask), final, spread_init, initial


def _ratio(margin, radius) -> float | None:
    if margin is None or radius is None:
        return None
    return float(margin) / float(radius) if radius > 0 else float("nan")


def member_margin(gram, y, solver: dict):
    """(margin, gap, info) of ``ntk.simplex_margin`` as floats; all None (radius too) when the Gram
    is not finite: such a margin cannot be computed, and 0 would read as "not separable"."""
    if not np.all(np.isfinite(gram)):
        return None, None, {"radius": None}
    margin, gap, info = ntk.simplex_margin(gram, y, return_info=True, **solver)
    return float(margin), float(gap), dict(info, radius=float(info["radius"]))


def extra_results(experiment, trained, loss_curves: dict[int, dict]) -> dict:
    """{member index: fields} for every member of the sweep (see the module docstring);
    ``trained``: the trainer's TrainedProgram list, ``loss_curves``: {member index: recorded curve}."""
    solver = solver_settings(experiment.config)
    factor = float(setting(experiment.config, "train.divergence_factor"))
    window = tuple(float(v) for v in setting(experiment.config, "analysis.slope_window"))
    out, linear = {}, {}
    for done in trained:
        recipe = done.program.recipe
        fn = jax.jit(
            lambda params, consts, recipe=recipe: jax.lax.map(lambda pc: _member_pieces(recipe, *pc), (params, consts))
        )
        grams, distances, spreads, final, spreads_init, initial = jax.device_get(fn(done.states.params, done.consts))
        # the path's own verdict (train/status.py): non-finite on the way, or above the factor at some step
        path_diverged = np.asarray(done.states.diverged) | (np.asarray(done.states.exceeded_at) >= 0)
        for j, i in enumerate(done.program.members):
            member = experiment.members[i]
            n, seed, eta = member["num_train"], member["seed"], float(member["step_size"])
            total = experiment.member_info(member)["own_steps"]
            X, y = experiment.train_data(seed)
            margin, gap, info = member_margin(grams[j][:n, :n], y[:n], solver)
            steps_sum = mixture_parts.step_sum(recipe.step_rule, eta, total)
            if (seed, n) not in linear:
                flat = ntk.linear_margin(X[:n], y[:n], "flatten", return_info=True, **solver)
                mean = ntk.linear_margin(X[:n], y[:n], "mean", return_info=True, **solver)
                linear[(seed, n)] = (flat, mean)
            flat, mean = linear[(seed, n)]
            record = {
                "ntk_margin": margin,
                "ntk_margin_gap": gap,
                "ntk_radius": info["radius"],
                "ntk_margin_normalized": _ratio(margin, info["radius"]),
                "linear_margin": float(flat[0]),
                "linear_margin_normalized": _ratio(flat[0], flat[2]["radius"]),
                "linear_margin_mean": float(mean[0]),
                "linear_margin_mean_normalized": _ratio(mean[0], mean[2]["radius"]),
                "param_distance": float(distances[j]),
                "head_spread": float(spreads[j]),
                "head_spread_init": float(spreads_init[j]),
                "step_sum": steps_sum,
                "initial_loss": float(initial[j]),
                "train_loss": float(final[j]),
                "margin_loss_product": None,
            }
            # L(theta_K) at 0 (or subnormal) makes the product 0 whatever the rate was: no product then
            if recipe.exponential_tail and margin is not None and float(final[j]) > LOSS_FLOOR:
                record["margin_loss_product"] = float(margin) ** 2 * steps_sum * float(final[j])
            if not recipe.exponential_tail:
                record.update(grad_norm_over_loss=None, min_hessian_eig_over_loss_sqrtH=None)
            diverged = bool(path_diverged[j])
            if factor > 0 and not float(final[j]) <= factor * float(initial[j]):
                diverged = True
                record["status"] = "diverged"
                record["diverged_at_step"] = int(total)  # L(theta_K) is where it shows
                record["diverged_reason"] = (
                    f"L(theta_K) = {float(final[j]):.4g} > train.divergence_factor {factor:g} x L(theta_0) = "
                    f"{float(initial[j]):.4g}"
                )
            curve = loss_curves.get(i)
            if curve is not None:
                record.update(_curve_fields(recipe, curve, eta, total, float(final[j]), window))
            if diverged:  # a rate or product read from a run that failed is not a rate
                record.update(dict.fromkeys(RATE_FIELDS))
                if curve is not None:
                    record["loss_slope_window"], record["loss_slope_points"] = None, 0
                    record["loss_slope_note"] = "the member diverged: no rate"
            out[i] = record
    return out


def _curve_fields(recipe, curve: dict, eta: float, total: int, final: float, window) -> dict:
    """``loss_curve`` (the recorded points, frozen after the member's own K, with L(theta_K)
    appended), ``loss_zero_at_step`` (the first step k with L(theta_k) at or below LOSS_FLOOR,
    from every step's loss: train/records.py; K when only L(theta_K) is) and the slope fit."""
    kept = [(k, v) for k, v in zip(curve["steps"], curve["values"]) if k < total]  # frozen after K
    steps = [k for k, _ in kept] + [total]
    values = [v if math.isfinite(v) else None for v in [v for _, v in kept] + [final]]
    zero = curve.get("zero_at_step")
    zero = zero if zero is not None and zero < total else (total if final <= LOSS_FLOOR else None)
    clock = mixture_parts.step_sums(recipe.step_rule, eta, steps)
    fit = fit_loss_slope(steps, values, total, clock, window, zero)
    return {"loss_curve": {"steps": steps, "values": values}, "loss_zero_at_step": zero, **fit}
