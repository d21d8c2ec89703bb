"""Attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers",
arXiv 2005.00928) beside the DAG metrics.

Per layer the heads are combined into one operator (by the learned head weights beta of the
DAG analysis, :func:`mhjax.analysis.metrics.learned_head_weights`, or by their plain mean), the
residual connection is accounted for as ``0.5 A + 0.5 I``, and the rollout through layer l is
the product ``R_l = (0.5 A_l + 0.5 I) ... (0.5 A_0 + 0.5 I)``: ``R_l[i, j]`` is the share of
position i's representation after layer l that traces back to input token j. Every factor is
row-stochastic, so every row of ``R_l`` sums to 1.

The rollout analogue of minimax fidelity is the sink row's minimum: ``min_j R_l[T-1, j]``, the
share at the sink (the last position) of the worst-served input position (over j < T-1 when
the DAG analysis excludes the sink, as minimax fidelity does).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from mhjax.analysis import dag
from mhjax.analysis.ranks import spearman

_HI = jax.lax.Precision.HIGHEST


def rollout(attn, beta=None):
    """attn ``(L, ..., H, T, T)``, beta ``(L, H)`` (None: the plain mean over heads) ->
    ``(L, ..., T, T)``: the rollout through layers 0..l for every l."""
    attn = jnp.asarray(attn)
    L, H, T = attn.shape[0], attn.shape[-3], attn.shape[-1]
    if beta is None:
        beta = jnp.full((L, H), 1.0 / H, attn.dtype)
    beta = jnp.asarray(beta).reshape(L, *([1] * (attn.ndim - 4)), H)
    steps = 0.5 * dag.combine(attn, beta) + 0.5 * jnp.eye(T, dtype=attn.dtype)

    def step(acc, layer):
        acc = jnp.einsum("...ij,...jk->...ik", layer, acc, precision=_HI)
        return acc, acc

    start = jnp.broadcast_to(jnp.eye(T, dtype=steps.dtype), steps.shape[1:])
    return jax.lax.scan(step, start, steps)[1]


def sink_row_minimum(rows, include_sink: bool = True):
    """``min_j`` of sink rows ``(..., T)``; over j < T-1 only when ``include_sink`` is False."""
    return jnp.min(rows if include_sink else rows[..., :-1], axis=-1)


@partial(jax.jit, static_argnames=("include_sink",))
def sink_rollout(attn, beta, include_sink: bool = True) -> dict:
    """Per layer and sequence: attn ``(L, N, H, T, T)``, beta ``(L, H)`` -> ``min`` (L, N) and
    ``min_mean_heads`` (L, N) (beta-weighted / plain head mean), ``sink_row`` (L, N, T)
    (beta-weighted)."""
    weighted = rollout(attn, beta)[..., -1, :]
    plain = rollout(attn)[..., -1, :]
    return {
        "min": sink_row_minimum(weighted, include_sink),
        "min_mean_heads": sink_row_minimum(plain, include_sink),
        "sink_row": weighted,
    }


def rollout_summary(per_sequence: dict, fidelity: np.ndarray) -> tuple[dict, list[dict]]:
    """From :func:`sink_rollout`'s per-sequence values (L, N) and layer l's per-sequence minimax
    fidelity (L, N): the member's ``rollout_min`` and ``rollout_min_mean_heads`` (through the
    last layer, mean over sequences) and per layer ``rollout_min``, ``rollout_min_mean_heads``
    and ``rollout_fidelity_spearman`` (across sequences)."""
    weighted = np.asarray(per_sequence["min"], np.float64)
    plain = np.asarray(per_sequence["min_mean_heads"], np.float64)
    layers = [
        {
            "rollout_min": float(weighted[l].mean()),
            "rollout_min_mean_heads": float(plain[l].mean()),
            "rollout_fidelity_spearman": spearman(weighted[l], fidelity[l]),
        }
        for l in range(weighted.shape[0])
    ]
    member = {"rollout_min": float(weighted[-1].mean()), "rollout_min_mean_heads": float(plain[-1].mean())}
    return member, layers
