"""The mixture experiment's model, loss and step rule as plug-ins, chosen by name in the config.

* ``config.model.phi``: attention weights from a row of scores, (..., T) -> (..., T).
  "softmax" (arXiv 2310.12680) or "linear" (the raw scores). A registered phi must be finite
  at zero scores: W = 0 at theta_0 in the default init.
* ``config.train.loss``: l(z) of the margin z = y Phi, elementwise. "logistic" = softplus(-z),
  "exponential" = exp(-z), "squared" = (1 - z)^2 / 2. ``exponential_tail`` says whether the
  theory's quantities that assume an exponential tail (gamma^2 eta K L, the 1/K rate,
  ||grad L|| / L, sqrt(H) lambda_min / L, c / (gamma^2 n)) apply; they are null otherwise.
* ``config.train.step_rule``: rule(count, step_size) -> rate of GD step ``count``. "constant"
  = step_size, "inverse_sqrt" = step_size / sqrt(1 + count). Before training it is run on every
  step 0..K-1 of each member's own K with its own step size (``check_step_rule``): a rate that is
  not finite or negative at a step, or 0 at every step, is refused (0 from some step on is not).

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


# A plug-in loss is run on margins of two sizes, neither 3 (the size a fixed (3,) vector would
# match by accident), before anything compiles: it must keep each input's shape.
LOSS_PROBES = (jnp.array([-2.0, 0.0, 2.0, 5.0], jnp.float32), jnp.array([-1.0, 1.0], jnp.float32))


def check_parts(names: dict, seq_len: int) -> None:
    """Run each chosen part on small inputs before anything compiles: registered, the right shape,
    finite (phi at zero scores of 2 and 5 rows; the loss at 4 and 2 margins). The step rule is only
    run here, at steps 0, 1, 2, for a scalar or one rate per step: ``check_step_rule`` checks its
    values at every step with the members' own step sizes before training."""
    t = int(seq_len)
    probes = {
        "phi": [(jnp.zeros((b, t), jnp.float32),) for b in (2, 5)],
        "loss": [(z,) for z in LOSS_PROBES],
        "step_rule": [(jnp.arange(3, dtype=jnp.int32), jnp.float32(0.5))],
    }
    for kind, inputs in probes.items():
        plugin = get(kind, names[kind])
        where = f"{FIELDS[kind]}: {KINDS[kind].noun} {plugin.name!r} ({plugin.label()})"
        for args in inputs:
            try:
                out = np.asarray(plugin.fn(*args))
            except Exception as exc:
                raise ConfigError(f"{where}: failed on a test input: {one_line(exc)}") from None
            if kind == "step_rule":
                if out.shape not in ((), (3,)):
                    raise ConfigError(f"{where}: must give one rate per step; got shape {out.shape} for steps 0, 1, 2")
                continue
            if out.shape != args[0].shape:
                raise ConfigError(f"{where}: must keep the input's shape {tuple(args[0].shape)}; got {out.shape}")
            if not np.all(np.isfinite(out)):
                at = "zero scores" if kind == "phi" else "margins " + ", ".join(f"{v:g}" for v in np.asarray(args[0]))
                raise ConfigError(f"{where}: not finite at {at}")


RULE_CHUNK = 2**20  # steps of a step rule evaluated at once by check_step_rule (4 MiB of rates)


def first_bad_steps(rule, step_size: float, steps: int) -> tuple[int, int, int, float]:
    """(first step with a non-finite rate, first with a negative one, first with a positive one,
    the rate at the first of the two bad ones) of ``rule`` over the steps 0..steps-1 with
    ``step_size``; a step is ``steps`` (and the rate NaN) where there is none. The rates are
    computed as the optimizer computes them (int32 count, float32 step size), in chunks of
    RULE_CHUNK steps (one compile)."""
    steps = int(steps)
    length, top = max(1, min(steps, RULE_CHUNK)), max(steps - 1, 0)
    counts = jnp.arange(length, dtype=jnp.int32)
    rates = jax.jit(lambda start, eta: jax.vmap(rule, (0, None))(jnp.minimum(start + counts, top), eta))
    found, value = [steps] * 3, float("nan")
    for start in range(0, steps, length):
        values = np.asarray(rates(np.int32(start), np.float32(step_size)), np.float64)
        values = np.broadcast_to(values, (length,))[: steps - start]
        for slot, bad in enumerate((~np.isfinite(values), values < 0, values > 0)):
            hits = np.flatnonzero(bad)
            if found[slot] == steps and hits.size:
                found[slot] = start + int(hits[0])
        if min(found[:2]) < steps:  # the rule is refused at this step: later steps change nothing
            value = float(values[min(found[:2]) - start])
            break
    return found[0], found[1], found[2], value


def check_step_rule(name: str, runs) -> None:
    """ConfigError (one line naming the rule, the step size and the first bad step) unless the
    rule gives a finite rate >= 0 at every step 0..K-1 of each (step size, K) of ``runs`` and a
    positive one at some step (a schedule that decays to 0 is allowed; 0 throughout trains
    nothing, a negative rate is ascent)."""
    plugin = get("step_rule", name)
    where = f"{FIELDS['step_rule']}: step rule {plugin.name!r} ({plugin.label()})"
    runs = sorted({(float(eta), int(steps)) for eta, steps in runs})
    longest = {}
    for eta, steps in runs:
        longest[eta] = max(longest.get(eta, 0), steps)
    try:
        found = {eta: first_bad_steps(plugin.fn, eta, steps) for eta, steps in longest.items()}
    except Exception as exc:  # e.g. Python control flow on the step count, which jit cannot trace
        raise ConfigError(f"{where}: failed when run on every step under jax.jit: {one_line(exc)}") from None
    for eta, steps in runs:
        nonfinite, negative, positive, value = found[eta]
        rule = f"a rate must be finite and >= 0 at every step 0..K-1 (K = {steps}) and > 0 at some step"
        if min(nonfinite, negative) < steps:
            raise ConfigError(
                f"{where}: gives {value:g} at step {min(nonfinite, negative)} with step size {eta:g}; {rule}"
            )
        if positive >= steps:
            raise ConfigError(f"{where}: gives 0 at every step with step size {eta:g}; {rule}")


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
