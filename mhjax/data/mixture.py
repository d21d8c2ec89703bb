"""Tokenized-mixture data model of arXiv 2310.12680 (Deora et al.).

Cluster layout (orthogonal means = scaled standard basis vectors of R^d):

    * label +1 relevant clusters: e_0 .. e_{R-1}
    * label -1 relevant clusters: e_R .. e_{2R-1}
    * noise (irrelevant) clusters: e_{2R} .. e_{2R+M-1}

each scaled by ``signal_norm`` S, so ``dim >= 2R + M`` is required
(R = ``num_relevant_per_label``, M = ``num_noise_clusters``).

A sample: y ~ uniform{-1, +1}; exactly ``k = round(relevant_fraction * seq_len)``
token positions, chosen uniformly at random (so position carries no
information), are relevant tokens (mean of a uniformly chosen cluster of label
y); the other T - k tokens are irrelevant tokens (mean of a uniformly chosen
noise cluster); every token adds N(0, noise_std^2 I).

Train/test separation: the caller draws train and test sets from different keys,
e.g. ``train_key, test_key = train_test_split_keys(key)``; test data are fresh
draws from the same distribution.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np


def default_mixture_config() -> ml_collections.ConfigDict:
    """Small, learnable but non-trivial defaults.

    d=16, T=8, zeta=0.25 (k=2 relevant tokens of 8), one relevant cluster per
    label, M=4 noise clusters, S=3, sigma=1. Measured once (seed 0, n=256
    train, 4000 test, zero init + GD with eta=1 for 1000 steps): the attention
    classifier reaches ~98.5% test accuracy (H=1 and H=16), while logistic
    regression on the mean token reaches ~92% and the mean-token training set
    is not linearly separable; with S=3, sigma=0.5 every method is at 100%
    after 10 steps (too easy), with S=2, sigma=1 test accuracy is ~87%.
    """
    cfg = ml_collections.ConfigDict()
    cfg.dim = 16  # d: token dimension
    cfg.seq_len = 8  # T: tokens per sample
    cfg.num_relevant_per_label = 1  # R: relevant clusters per label
    cfg.num_noise_clusters = 4  # M: irrelevant clusters
    cfg.relevant_fraction = 0.25  # zeta: fraction of relevant tokens
    cfg.signal_norm = 3.0  # S: norm of every cluster mean
    cfg.noise_std = 1.0  # sigma: per-coordinate token noise
    return cfg


def train_test_split_keys(key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Independent (train_key, test_key) derived from one key (fold_in 0 / 1)."""
    return jax.random.fold_in(key, 0), jax.random.fold_in(key, 1)


def num_relevant_tokens(cfg: Any) -> int:
    """k = round(zeta * T): number of relevant tokens in every sample."""
    return int(round(float(cfg.relevant_fraction) * int(cfg.seq_len)))


class MixtureConfigError(ValueError):
    """A bad data-config field: ``field`` names it, the message is one line "<field>: ..."."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_number(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def validate_mixture_config(cfg: Any) -> None:
    """Raise MixtureConfigError (a ValueError, one line "<field>: ...") on the first bad field.

    The one validator of the data fields: the sampler calls it, and the mixture experiment
    turns its errors into ``config.data.<field>`` ConfigErrors."""
    for field, low in (("dim", 1), ("seq_len", 1), ("num_relevant_per_label", 1), ("num_noise_clusters", 0)):
        value = getattr(cfg, field)
        if not is_int(value) or value < low:
            raise MixtureConfigError(field, f"must be an integer >= {low}; got {value!r}")
    for field in ("relevant_fraction", "signal_norm", "noise_std"):
        value = getattr(cfg, field)
        if not is_number(value) or not math.isfinite(value):
            raise MixtureConfigError(field, f"must be a finite number; got {value!r}")
    d, t = int(cfg.dim), int(cfg.seq_len)
    r, m = int(cfg.num_relevant_per_label), int(cfg.num_noise_clusters)
    if d < 2 * r + m:
        raise MixtureConfigError(
            "dim",
            f"must be >= 2*num_relevant_per_label + num_noise_clusters = {2 * r + m} "
            f"(orthogonal cluster means); got {d}",
        )
    if not 0.0 < float(cfg.relevant_fraction) <= 1.0:
        raise MixtureConfigError("relevant_fraction", f"must be in (0, 1]; got {cfg.relevant_fraction}")
    k = num_relevant_tokens(cfg)
    if k < 1:
        raise MixtureConfigError(
            "relevant_fraction",
            f"relevant_fraction * seq_len must round to >= 1 relevant token; got {cfg.relevant_fraction} * {t}",
        )
    if k < t and m < 1:
        raise MixtureConfigError(
            "num_noise_clusters",
            "must be >= 1 when some tokens are irrelevant (relevant_fraction * seq_len < seq_len); got 0",
        )
    if float(cfg.signal_norm) < 0:
        raise MixtureConfigError("signal_norm", f"must be >= 0; got {cfg.signal_norm}")
    if float(cfg.noise_std) < 0:
        raise MixtureConfigError("noise_std", f"must be >= 0; got {cfg.noise_std}")


def sample_mixture(key: jax.Array, cfg: Any, n: int, *, return_relevant: bool = False):
    """Draw n i.i.d. samples.

    Args:
        key: PRNG key (use different keys for train and test).
        cfg: ConfigDict / object with the fields of ``default_mixture_config``.
            Read in Python (static); only ``key`` may be traced, so the function
            jits and vmaps over keys.
        n: number of samples (static).
        return_relevant: also return the (n, T) bool mask of relevant tokens.

    Returns:
        X: (n, T, d) float32 tokens; y: (n,) float32 labels in {-1, +1};
        [relevant: (n, T) bool].
    """
    validate_mixture_config(cfg)
    x, y, relevant = _sample(
        key,
        n=int(n),
        d=int(cfg.dim),
        t=int(cfg.seq_len),
        r=int(cfg.num_relevant_per_label),
        m=int(cfg.num_noise_clusters),
        k=num_relevant_tokens(cfg),
        signal_norm=float(cfg.signal_norm),
        noise_std=float(cfg.noise_std),
    )
    if return_relevant:
        return x, y, relevant
    return x, y


# Jitted with the config as static arguments: one compiled program instead of
# many eager op dispatches; inlined when called under an outer jit / vmap.
@functools.partial(jax.jit, static_argnames=("n", "d", "t", "r", "m", "k", "signal_norm", "noise_std"))
def _sample(key, *, n, d, t, r, m, k, signal_norm, noise_std):
    k_y, k_pos, k_rel, k_noise_c, k_eps = jax.random.split(key, 5)
    y = jnp.where(jax.random.bernoulli(k_y, 0.5, (n,)), 1.0, -1.0)
    # Random positions: a token is relevant iff its rank under i.i.d. uniforms
    # is < k, i.e. a uniformly random k-subset of positions.
    ranks = jnp.argsort(jnp.argsort(jax.random.uniform(k_pos, (n, t)), axis=1), axis=1)
    relevant = ranks < k
    # Relevant cluster index: label +1 -> [0, R), label -1 -> [R, 2R).
    rel_idx = jnp.where(y > 0, 0, r)[:, None] + jax.random.randint(k_rel, (n, t), 0, r)
    noise_idx = 2 * r + jax.random.randint(k_noise_c, (n, t), 0, max(m, 1))
    idx = jnp.where(relevant, rel_idx, noise_idx)
    means = signal_norm * jax.nn.one_hot(idx, d, dtype=jnp.float32)
    x = means + noise_std * jax.random.normal(k_eps, (n, t, d), jnp.float32)
    return x, y.astype(jnp.float32), relevant


DATA_FIELDS = (  # the fields of the tokenized mixture (the generator "tokenized_mixture")
    "dim",
    "seq_len",
    "num_relevant_per_label",
    "num_noise_clusters",
    "relevant_fraction",
    "signal_norm",
    "noise_std",
)
