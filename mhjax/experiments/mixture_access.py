"""A trained mixture sweep from Python: its data, theta_0, parameters, model and NTK.

Everything is rebuilt from the run's own config and plug-ins (W/mhjax.json), with the same
keys and programs as training, so the numbers are the run's: ``ntk(..., step=0).margin`` is
results.json's ``ntk_margin`` (same Gram, same solver settings), ``model(...)`` applied to
``data(seed)``'s test set gives its ``test_loss`` under the run's loss.

Parameters are stored padded to the sweep's largest head count H_max; ``unpad`` cuts them to
the member's own H (``params`` and ``theta0`` return them unpadded), and ``model`` takes
unpadded parameters.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from mhjax.analysis import ntk as ntk_lib
from mhjax.experiments.mixture_config import solver_settings
from mhjax.experiments.mixture_results import member_margin


class MixtureData(NamedTuple):
    """A seed's data: its largest n training examples and its test set (numpy)."""

    x_train: np.ndarray  # (n_max, T, d) float32
    y_train: np.ndarray  # (n_max,) float32 in {-1, +1}
    x_test: np.ndarray  # (num_test, T, d)
    y_test: np.ndarray  # (num_test,)


class NTK(NamedTuple):
    """The empirical NTK of a member on its own n training examples at one step."""

    step: int
    gram: np.ndarray  # (n, n) float32
    margin: float | None  # certified lower bound of the hard margin (results.json's ntk_margin at step 0)
    gap: float | None  # the true margin lies in [margin, margin + gap]
    radius: float | None  # max_i ||grad_theta Phi(x_i)||


def member_index(experiment, name: str) -> int:
    for i, m in enumerate(experiment.members):
        if m.name == name:
            return i
    raise KeyError(name)


def data(experiment, seed: int) -> MixtureData:
    return MixtureData(*experiment.train_data(seed), *experiment.test_data(seed))


def _recipe(experiment):
    return experiment.programs("auto", jax.default_backend())[0].recipe


def _consts(experiment, name: str):
    member = experiment.members[member_index(experiment, name)]
    return jax.tree_util.tree_map(jnp.asarray, experiment.member_constants(member))


def unpad(params, heads: int) -> dict:
    """{'W': (H, d, d), 'U': (H, ...)} of a member's first ``heads`` heads (numpy)."""
    return {k: np.asarray(v)[:heads] for k, v in params.items()}


def pad(params, max_heads: int) -> dict:
    """Unpadded params back to ``max_heads`` heads (zeros: masked heads)."""
    out = {}
    for k, v in params.items():
        v = np.asarray(v)
        out[k] = np.concatenate([v, np.zeros((max_heads - v.shape[0],) + v.shape[1:], v.dtype)])
    return out


def theta0(experiment, name: str) -> dict:
    """theta_0 of member ``name`` (unpadded), as training drew it."""
    recipe, consts = _recipe(experiment), _consts(experiment, name)
    heads = experiment.members[member_index(experiment, name)]["heads"]
    return unpad(jax.jit(recipe.init_params)(consts), heads)


def model(experiment, name: str):
    """apply(params, X): (N, T, d) -> (N,) Phi of member ``name``'s model at its own head count,
    with the run's attention map phi; ``params`` unpadded (``theta0``, ``params``)."""
    from mhjax.models import classifier

    recipe = _recipe(experiment)
    heads = experiment.members[member_index(experiment, name)]["heads"]
    mask = jnp.ones((heads,), jnp.float32)

    def apply(params, X):
        return classifier.classifier_apply(params, jnp.asarray(X), mask, heads, recipe.query, recipe.attention)

    return apply


def loss(experiment):
    """The run's loss l(z) of the margin z = y Phi (elementwise)."""
    return _recipe(experiment).margin_loss


def ntk(experiment, name: str, padded_params, step: int) -> NTK:
    """The NTK Gram of member ``name`` at ``padded_params`` on its own n training examples and its
    hard margin, with the run's analysis.margin_iters and margin_tol (as results.json at step 0)."""
    recipe, consts = _recipe(experiment), _consts(experiment, name)
    member = experiment.members[member_index(experiment, name)]
    n = int(member["num_train"])
    params = jax.tree_util.tree_map(jnp.asarray, padded_params)
    fn = jax.jit(lambda p, c: ntk_lib.ntk_gram(recipe.apply_single(c), p, c.X, chunk_size=min(64, recipe.max_train)))
    gram = np.asarray(fn(params, consts))[:n, :n]
    margin, gap, info = member_margin(gram, np.asarray(consts.y)[:n], solver_settings(experiment.config))
    return NTK(int(step), gram, margin, gap, info["radius"])


def padded_theta0(experiment, name: str):
    return jax.jit(_recipe(experiment).init_params)(_consts(experiment, name))


def analyze(experiment, states: dict[int, dict[str, Any]]) -> list[dict]:
    """One record per (member, step) of ``states`` ({step: {member name: padded params}}):
    {"member", "step", "ntk_margin", "ntk_margin_gap", "ntk_radius"} and the recipe's evaluation
    at that step (train_loss_eval, test_loss, test_accuracy, train_accuracy, hessian_min,
    hessian_max, step_times_hessian_max, distance_from_init and, for a loss with an exponential
    tail, grad_norm_over_loss and min_hessian_eig_over_loss_sqrtH), as floats."""
    recipe = _recipe(experiment)
    evaluate = jax.jit(recipe.evaluate)
    rows = []
    for step in sorted(states):
        for name, params in states[step].items():
            kernel = ntk(experiment, name, params, step)
            values = evaluate(jax.tree_util.tree_map(jnp.asarray, params), _consts(experiment, name), jnp.int32(step))
            rows.append(
                {
                    "member": name,
                    "step": int(step),
                    "ntk_margin": kernel.margin,
                    "ntk_margin_gap": kernel.gap,
                    "ntk_radius": kernel.radius,
                    **{k: float(v) for k, v in values.items()},
                }
            )
    return rows
