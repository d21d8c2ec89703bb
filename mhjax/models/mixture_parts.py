"""The mixture experiment's model, loss and step rule as plug-ins, chosen by name in the config.

* ``config.model.phi``: attention weights from a row of scores, (..., T) -> (..., T).
  "softmax" (arXiv 2310.12680) or "linear" (the raw scores). A registered phi must be finite
  at zero scores: W = 0 at theta_0 in the default init.
* ``config.train.loss``: l(z) of the margin z = y Phi, elementwise. "logistic" = softplus(-z),
  "exponential" = exp(-z), "squared" = (1 - z)^2 / 2. ``exponential_tail`` says whether the
  theory's quantities that assume an exponential tail (gamma^2 eta K L, the 1/K rate,
  ||grad L|| / L, sqrt(H) lambda_min / L, c / (gamma^2 n)) apply; they are null otherwise.
* ``config.train.step_rule``: rule(count, step_size) -> rate of GD step ``count``. "constant"
  = step_size, "inverse_sqrt" = step_size / sqrt(1 + count).

``mhjax.register_mixture(kind, name, fn)`` adds one (kind "phi", "loss" or "step_rule"; "data"
registers a data generator, as ``@mhjax.mixture_data`` does). W/mhjax.json records where each
plug-in a run used came from, so a later process registers it again.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from mhjax.config import ConfigError
from mhjax.data import mixture_data
from mhjax.data.plugins import Registry, one_line

PHI = Registry("phi")
LOSS = Registry("loss")
STEP_RULE = Registry("step rule")
KINDS = {"phi": PHI, "loss": LOSS, "step_rule": STEP_RULE}
DEFAULTS = {"phi": "softmax", "loss": "logistic", "step_rule": "constant"}
FIELDS = {"phi": "config.model.phi", "loss": "config.train.loss", "step_rule": "config.train.step_rule"}


def register_mixture(kind: str, name: str, fn, *, exponential_tail: bool = False):
    """Register ``fn`` as a mixture ``kind`` ("phi", "loss", "step_rule", or "data") named
    ``name``. ``exponential_tail`` (losses only): l(z) ~ exp(-z) as z grows, so the rate and
    margin quantities of the theory apply."""
    if kind == "data":
        return mixture_data.register_mixture_data(name, fn)
    if kind not in KINDS:
        raise ConfigError(f"register_mixture: kind must be one of data, {', '.join(KINDS)}; got {kind!r}")
    options = {"exponential_tail": bool(exponential_tail)} if kind == "loss" else {}
    return KINDS[kind].register(name, fn, **options)


def _softmax(scores):
    return jax.nn.softmax(scores, axis=-1)


def _linear(scores):
    return scores


def _logistic(z):
    return jax.nn.softplus(-z)


def _exponential(z):
    return jnp.exp(-z)


def _squared(z):
    return 0.5 * (1.0 - z) ** 2


def _constant(count, step_size):
    return step_size


def _inverse_sqrt(count, step_size):
    return step_size / jnp.sqrt(1.0 + count)


register_mixture("phi", "softmax", _softmax)
register_mixture("phi", "linear", _linear)
register_mixture("loss", "logistic", _logistic, exponential_tail=True)
register_mixture("loss", "exponential", _exponential, exponential_tail=True)
register_mixture("loss", "squared", _squared)
register_mixture("step_rule", "constant", _constant)
register_mixture("step_rule", "inverse_sqrt", _inverse_sqrt)


def get(kind: str, name: str):
    return KINDS[kind].get(name, FIELDS[kind])


def exponential_tail(loss_name: str) -> bool:
    return bool(LOSS.get(loss_name, FIELDS["loss"]).options.get("exponential_tail", False))


def check_parts(names: dict, seq_len: int) -> None:
    """Run each chosen part on small inputs before anything compiles: registered, finite, the
    right shape (phi at zero scores; the loss at a few margins; the rule at a few steps)."""
    t = int(seq_len)
    for kind, probe in (
        ("phi", lambda f: f(jnp.zeros((2, t), jnp.float32))),
        ("loss", lambda f: f(jnp.array([-2.0, 0.0, 2.0], jnp.float32))),
        ("step_rule", lambda f: f(jnp.arange(3, dtype=jnp.int32), jnp.float32(0.5))),
    ):
        plugin = get(kind, names[kind])
        where = f"{FIELDS[kind]}: {kind} {plugin.name!r} ({plugin.label()})"
        try:
            out = np.asarray(probe(plugin.fn))
        except Exception as exc:
            raise ConfigError(f"{where}: failed on a test input: {one_line(exc)}") from None
        want = {"phi": (2, t), "loss": (3,), "step_rule": None}[kind]
        if want is not None and out.shape != want:
            raise ConfigError(f"{where}: must keep the input's shape {want}; got {out.shape}")
        if not np.all(np.isfinite(out)):
            at = {"phi": "zero scores", "loss": "margins -2, 0, 2", "step_rule": "steps 0, 1, 2"}[kind]
            raise ConfigError(f"{where}: not finite at {at}")


def step_sums(rule, step_size: float, ks) -> np.ndarray:
    """S_k = sum_{j<k} rule(j, step_size) for each k of ``ks`` (float64 on the host): the clock
    against which a rate in K is read when the step size varies (S_k = step_size * k for the
    constant rule)."""
    ks = np.asarray(ks, np.int64)
    top = int(ks.max(initial=0))
    if top <= 0:
        return np.zeros(ks.shape)
    if not step_size:
        return np.full(ks.shape, math.nan)
    rates = np.asarray(jax.jit(jax.vmap(rule, (0, None)))(jnp.arange(top), jnp.float32(step_size)), np.float64)
    # in units of the float32 step size, so that the constant rule gives step_size * k exactly
    units = np.broadcast_to(rates, (top,)) / np.float64(np.float32(step_size))
    cumulative = np.concatenate([[0.0], np.cumsum(units)])
    return cumulative[np.clip(ks, 0, top)] * step_size


def step_sum(rule, step_size: float, steps: int) -> float:
    """sum_{k < steps} rule(k, step_size), in float64 on the host (= step_size * steps for the
    constant rule, exactly)."""
    if steps <= 0:
        return 0.0
    rates = np.asarray(jax.jit(jax.vmap(rule, (0, None)))(jnp.arange(steps), jnp.float32(step_size)), np.float64)
    rates = np.broadcast_to(rates, (steps,))
    return float(np.sum(rates / np.float64(np.float32(step_size)))) * step_size if step_size else math.nan
