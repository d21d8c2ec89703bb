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

import time
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


def ntk(experiment, name: str, padded_params, step: int, gram=None) -> NTK:
    """The NTK Gram of member ``name`` at ``padded_params`` on its own n training examples and its
    hard margin, with the run's analysis.margin_iters and margin_tol (as results.json at step 0).
    ``gram``: a gram_function, compiled once for every member (they share shapes)."""
    consts = _consts(experiment, name)
    member = experiment.members[member_index(experiment, name)]
    n = int(member["num_train"])
    params = jax.tree_util.tree_map(jnp.asarray, padded_params)
    gram = gram_function(_recipe(experiment)) if gram is None else gram
    matrix = np.asarray(gram(params, consts))[:n, :n]
    margin, gap, info = member_margin(matrix, np.asarray(consts.y)[:n], solver_settings(experiment.config))
    return NTK(int(step), matrix, margin, gap, info["radius"])


def gram_function(recipe):
    """jit(params, consts) -> the NTK Gram over all max_train examples."""
    return jax.jit(lambda p, c: ntk_lib.ntk_gram(recipe.apply_single(c), p, c.X, chunk_size=min(64, recipe.max_train)))


def padded_theta0(experiment, name: str):
    return padded_theta0s(experiment, [name])[name]


def padded_theta0s(experiment, names) -> dict:
    """{name: its theta_0, padded} for ``names``, the init compiled once for all of them."""
    init = jax.jit(_recipe(experiment).init_params)
    return {name: init(_consts(experiment, name)) for name in names}


def analyze(experiment, states: dict[int, dict[str, Any]], log=None) -> list[dict]:
    """One record per (member, step) of ``states`` ({step: {member name: padded params}}):
    {"member", "step", "ntk_margin", "ntk_margin_gap", "ntk_radius"} and the recipe's evaluation
    at that step (train_loss_eval, test_loss, test_accuracy, train_accuracy, hessian_min,
    hessian_max, step_times_hessian_max, distance_from_init and, for a loss with an exponential
    tail, grad_norm_over_loss and min_hessian_eig_over_loss_sqrtH), as floats. ``log``: the count
    before, an estimate and progress during (AnalyzeProgress)."""
    recipe = _recipe(experiment)
    evaluate, gram = jax.jit(recipe.evaluate), gram_function(recipe)  # compiled once for every member
    progress = AnalyzeProgress(sum(len(m) for m in states.values()), len(states), log)
    rows = []
    for step in sorted(states):
        for name, params in states[step].items():
            kernel = ntk(experiment, name, params, step, gram)
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
            progress.done(step)
    return rows


class AnalyzeProgress:
    """What an analysis of many (member, step) pairs says while it runs (``log``): their count
    before the first; after the second, an estimate of the whole timed on those two (the first
    compiles, the second runs as every later one will); then a line after 30 s without one and,
    where the whole takes 20 s or more, at every tenth done, with the time left."""

    def __init__(self, total: int, steps: int, log=None, clock=time.monotonic):
        self.total, self.count, self.log, self.clock = total, 0, log or (lambda message: None), clock
        self.start = self.last = clock()
        self.first = self.estimate = 0.0  # seconds of the first pair (compiling included), of all
        self.log(
            f"analyze: {total} (member, step) pairs ({total // max(steps, 1)} members x {steps} steps), each an NTK "
            "Gram, its margin and the Hessian's extreme eigenvalues; an estimate follows the first two"
        )

    def done(self, step: int) -> None:
        self.count += 1
        now = self.clock()
        elapsed = now - self.start
        if self.count == 1:
            self.first = elapsed
        elif self.count == 2:
            each = elapsed - self.first
            self.estimate, self.last = self.first + each * (self.total - 1), now
            self.log(
                f"analyze: about {self.estimate:.0f} s for the {self.total} pairs (the first {self.first:.1f} s "
                f"with compiling, then {each:.2f} s each)"
            )
        elif now - self.last >= 30 or (
            self.estimate >= 20 and self.count * 10 // self.total > (self.count - 1) * 10 // self.total
        ):
            left = (elapsed - self.first) / (self.count - 1) * (self.total - self.count)
            self.log(f"analyze: {self.count}/{self.total} done (step {step}), {elapsed:.0f} s, about {left:.0f} s left")
            self.last = now
