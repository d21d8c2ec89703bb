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
  the last decade of steps, k in [K/10, K].
* train_loss: L(theta_K), the full-batch loss after the last step (it was L(theta_{K-1}), the
  last step's input, before; = train_loss_eval).
* K is the member's own K (``own_steps``: train.steps, or steps_per_example * n).
* margin_loss_product = ntk_margin^2 * S_K * L(theta_K) with S_K = sum_{k<K} eta_k (= eta K
  for the constant step rule; field ``step_sum``): the theory's training rate L ~ 1/(gamma^2 S_K)
  makes it of order one and flat in K. Null for a loss without an exponential tail (the squared
  loss), as are grad_norm_over_loss and min_hessian_eig_over_loss_sqrtH.
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


def loss_slope(steps, values, total: int, clock=None) -> float:
    """Least-squares slope of log(loss) against log(clock) over k in [total/10, total], k >= 1;
    ``clock``: the value of each step's clock (S_k = sum_{j<k} eta_j), default k itself."""
    steps, values = np.asarray(steps, float), np.asarray(values, float)
    clock = steps if clock is None else np.asarray(clock, float)
    keep = (steps >= total / 10) & (steps >= 1) & np.isfinite(values) & (values > 0) & (clock > 0)
    if keep.sum() < 2:
        return float("nan")
    return float(np.polyfit(np.log(clock[keep]), np.log(values[keep]), 1)[0])


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
    out, linear = {}, {}
    for done in trained:
        recipe = done.program.recipe
        fn = jax.jit(
            lambda params, consts, recipe=recipe: jax.lax.map(lambda pc: _member_pieces(recipe, *pc), (params, consts))
        )
        grams, distances, spreads, final, spreads_init, initial = jax.device_get(fn(done.states.params, done.consts))
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
            if recipe.exponential_tail and margin is not None:
                record["margin_loss_product"] = float(margin) ** 2 * steps_sum * float(final[j])
            if not recipe.exponential_tail:
                record.update(grad_norm_over_loss=None, min_hessian_eig_over_loss_sqrtH=None)
            if factor > 0 and not float(final[j]) <= factor * float(initial[j]):
                record["status"] = "diverged"
                record["diverged_at_step"] = int(total)  # L(theta_K) is where it shows
                record["diverged_reason"] = (
                    f"L(theta_K) = {float(final[j]):.4g} > train.divergence_factor {factor:g} x L(theta_0) = "
                    f"{float(initial[j]):.4g}"
                )
            curve = loss_curves.get(i)
            if curve is not None:
                kept = [(k, v) for k, v in zip(curve["steps"], curve["values"]) if k < total]  # frozen after K
                steps = [k for k, _ in kept] + [total]
                values = [v if math.isfinite(v) else None for v in [v for _, v in kept] + [float(final[j])]]
                record["loss_curve"] = {"steps": steps, "values": values}
                finite = [(k, v) for k, v in zip(steps, values) if v is not None]
                ks = [k for k, _ in finite]
                clock = mixture_parts.step_sums(recipe.step_rule, eta, ks)
                record["loss_slope"] = loss_slope(ks, [v for _, v in finite], total, clock)
            out[i] = record
    return out
