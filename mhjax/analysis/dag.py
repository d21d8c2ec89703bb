"""Attention heads as feed-forward DAGs with a common sink: the DAG reading of attention, signal
diffusion, minimax fidelity and the mixing time of "Beyond Parallelism: Synergistic Computational
Graph Effects in Multi-Head Attention" (arXiv 2507.02944).

Conventions used throughout (all functions accept arbitrary leading batch dims,
e.g. layers, sequences, heads, ensemble members, written ``...``):

* ``A`` has shape ``(..., T, T)``; row ``i`` is the query / receiver, column
  ``j`` is the key / sender, rows sum to 1 and ``A`` is lower-triangular
  (causal). ``A[i, j] > 0`` is read as the edge ``j -> i``.
* The sink ``tau`` is the last position, ``T - 1``.
* Per-head attention has shape ``(..., H, T, T)`` and head weights ``(..., H)``.

Everything is plain ``jax.numpy`` with ``lax.scan`` over steps: no Python
loops over nodes, steps or walks, so the functions jit and vmap cleanly.
Inputs are computed in float32 (or float64 when ``jax_enable_x64`` is on and a
float64 array is passed). Matmuls request ``Precision.HIGHEST`` so that
accelerators do not silently use bf16/tf32 passes for the powers.
"""

from __future__ import annotations

from functools import partial
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
Chain = Literal["reference", "normalized"]

_HI = jax.lax.Precision.HIGHEST

__all__ = [
    "head_weights",
    "combine",
    "transition_matrix",
    "mixing_time",
    "mixing_time_mc",
    "node_fidelity",
    "sink_signals",
    "sink_signals_float64",
    "minimax_fidelity",
    "synergy",
]


def _as_float(x) -> Array:
    """Array in at least float32 (ints/halves are promoted, f64 kept if enabled)."""
    x = jnp.asarray(x)
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


# --------------------------------------------------------------------------- #
# Head weights and combination
# --------------------------------------------------------------------------- #
def head_weights(
    kind: Literal["uniform", "learned", "given"],
    num_heads: int,
    out_kernel=None,
    weights=None,
) -> Array:
    """Convex head weights ``beta`` (``beta_h >= 0``, sum 1 over the last axis).

    Args:
      kind: ``"uniform"`` -> ``1/H`` with shape ``(H,)``.
        ``"learned"`` -> ``beta_h`` proportional to the Frobenius norm of rows
        ``h*d:(h+1)*d`` of ``out_kernel`` (``d = D/H``); shape ``(..., H)``.
        ``"given"`` -> ``weights`` normalised to sum 1; shape ``(..., H)``.
      num_heads: ``H``.
      out_kernel: Flax ``(in, out)`` kernel of the attention output projection,
        shape ``(..., D, D)``. Rows ``h*d:(h+1)*d`` are what reads head ``h``'s
        output (in a PyTorch ``(out, in)`` weight it would be the column block,
        so transpose a torch weight before passing it).
      weights: nonnegative ``(..., H)`` for ``"given"``.

    A set of weights that sums to 0 falls back to uniform (no head carries any
    signal, so no head is preferred).
    """
    if kind == "uniform":
        return jnp.full((num_heads,), 1.0 / num_heads, dtype=jnp.float32)
    if kind == "learned":
        if out_kernel is None:
            raise ValueError("head_weights('learned') needs out_kernel of shape (..., D, D)")
        w = _as_float(out_kernel)
        d_in = w.shape[-2]
        if d_in % num_heads:
            raise ValueError(f"out_kernel input dim {d_in} is not divisible by num_heads={num_heads}")
        blocks = w.reshape(*w.shape[:-2], num_heads, d_in // num_heads, w.shape[-1])
        raw = jnp.sqrt(jnp.sum(blocks**2, axis=(-2, -1)))
    elif kind == "given":
        if weights is None:
            raise ValueError("head_weights('given') needs weights of shape (..., H)")
        raw = _as_float(weights)
        if raw.shape[-1] != num_heads:
            raise ValueError(f"weights last dim {raw.shape[-1]} != num_heads={num_heads}")
    else:
        raise ValueError(f"unknown head weight kind {kind!r}; use 'uniform', 'learned' or 'given'")
    total = jnp.sum(raw, axis=-1, keepdims=True)
    uniform = jnp.full_like(raw, 1.0 / num_heads)
    return jnp.where(total > 0, raw / jnp.where(total > 0, total, 1.0), uniform)


def combine(attn, beta) -> Array:
    """``A_bar = sum_h beta_h A_h``: attn ``(..., H, T, T)``, beta ``(..., H)`` -> ``(..., T, T)``.

    ``beta`` broadcasts against the leading dims of ``attn`` (e.g. a shared
    ``(H,)`` uniform weight vector for a ``(L, B, H, T, T)`` stack).
    """
    attn, beta = _as_float(attn), _as_float(beta)
    return jnp.sum(beta[..., :, None, None] * attn, axis=-3)


# --------------------------------------------------------------------------- #
# Mixing time
# --------------------------------------------------------------------------- #
def transition_matrix(A, chain: Chain = "reference") -> Array:
    """Row-stochastic walk matrix ``Q`` (..., T, T) with the sink absorbing.

    The walk moves forward in time: from node ``i`` to one of its receivers
    ``k`` (a row ``k`` with ``A[k, i] > 0``), i.e. it reads column ``i`` of A.

    * ``"reference"`` (default, reproduces the paper's sampler): with
      ``c_k = min(1, sum_{k' <= k} A[k', i])`` (column NOT normalised),
      ``Q[i, k] = c_k - c_{k-1}`` for ``k < T-1`` and ``Q[i, T-1] = 1 - c_{T-2}``:
      missing column mass goes to the sink, mass beyond 1 is cut off.
      Note: causal attention always has ``A[0, 0] = 1``, so ``c_0 = 1`` and a
      walk from node 0 never leaves it; node 0 therefore always contributes
      ``max_steps / T`` to the reference mixing time (1.0 for T = max_steps = 100).
    * ``"normalized"``: ``Q[i, k] = A[k, i] / sum_k' A[k', i]``, a proper random
      walk along out-edges; a column with zero mass jumps to the sink.
    """
    A = _as_float(A)
    T = A.shape[-1]
    cols = jnp.swapaxes(A, -1, -2)  # cols[..., i, k] = A[k, i]
    if chain == "reference":
        c = jnp.minimum(1.0, jnp.cumsum(cols, axis=-1))
        q = jnp.diff(c, axis=-1, prepend=jnp.zeros_like(c[..., :1]))
        q = q.at[..., T - 1].set(1.0 - c[..., T - 2] if T > 1 else 1.0)
    elif chain == "normalized":
        mass = jnp.sum(cols, axis=-1, keepdims=True)
        q = jnp.where(mass > 0, cols / jnp.where(mass > 0, mass, 1.0), 0.0)
        q = q.at[..., T - 1].add(jnp.where(mass[..., 0] > 0, 0.0, 1.0))
    else:
        raise ValueError(f"unknown chain {chain!r}; use 'reference' or 'normalized'")
    sink_row = jax.nn.one_hot(T - 1, T, dtype=q.dtype)
    return q.at[..., T - 1, :].set(sink_row)  # the sink is absorbing


@partial(jax.jit, static_argnames=("max_steps", "chain"))
def mixing_time(A, max_steps: int = 100, chain: Chain = "reference") -> Array:
    """Exact expected hitting time of the sink, capped at ``max_steps``: ``(..., T, T) -> (...)``.

    ``(1/T) sum_i sum_{s=0}^{max_steps-1} (1 - (Q^s)[i, T-1])`` with ``Q`` from
    :func:`transition_matrix`; each start ``i`` contributes
    ``E[min(steps to sink, max_steps)]`` and the sink itself contributes 0.
    Only the sink column of ``Q^s`` is needed, so we propagate the vector
    ``v_s = Q^s e_tau`` (absorption probabilities) with a scan: O(max_steps T^2).
    """
    Q = transition_matrix(A, chain)
    T = Q.shape[-1]
    v0 = jnp.broadcast_to(jax.nn.one_hot(T - 1, T, dtype=Q.dtype), Q.shape[:-1])

    def step(v, _):
        not_absorbed = jnp.sum(1.0 - v, axis=-1)  # sum over starts i
        return jnp.einsum("...ik,...k->...i", Q, v, precision=_HI), not_absorbed

    _, per_step = jax.lax.scan(step, v0, None, length=max_steps)
    return jnp.sum(per_step, axis=0) / T


@partial(jax.jit, static_argnames=("max_steps", "num_walks", "chain", "return_stderr"))
def mixing_time_mc(
    key: Array,
    A,
    max_steps: int = 100,
    num_walks: int = 100,
    chain: Chain = "reference",
    return_stderr: bool = False,
):
    """Seeded Monte Carlo estimate of :func:`mixing_time` (same chain, same cap).

    ``num_walks`` independent walks start from every node; each draws the next
    node by inverse-CDF sampling from ``Q[current]`` (the reference sampler's
    cumulative-sum rule) and counts steps until it reaches the sink or
    ``max_steps``. All walks of all batch items advance together in one
    ``lax.scan`` over steps.

    Returns ``(...)`` estimates, or ``(estimate, stderr)`` when
    ``return_stderr``; the stderr combines the per-start sample variances
    (``sqrt(sum_i var_i / W) / T``).
    """
    Q = transition_matrix(A, chain)
    T = Q.shape[-1]
    batch = Q.shape[:-2]
    cdf = jnp.cumsum(Q.reshape(-1, T, T), axis=-1)  # (B, T, T)
    B = cdf.shape[0]
    node0 = jnp.broadcast_to(jnp.arange(T)[None, :, None], (B, T, num_walks))
    keys = jax.random.split(key, max_steps)

    def step(state, k):
        node, steps = state
        u = jax.random.uniform(k, node.shape, dtype=cdf.dtype)
        # cdf row of each walk's current node: (B, T_starts, W, T)
        cur = jax.vmap(lambda c, n: c[n])(cdf, node)
        nxt = jnp.minimum(jnp.sum(cur <= u[..., None], axis=-1), T - 1)
        active = node != T - 1
        return (jnp.where(active, nxt, node), steps + active.astype(jnp.int32)), None

    (_, steps), _ = jax.lax.scan(step, (node0, jnp.zeros_like(node0)), keys)
    steps = steps.astype(Q.dtype)  # (B, T, W)
    est = jnp.mean(steps, axis=(-2, -1)).reshape(batch)
    if not return_stderr:
        return est
    var_i = jnp.var(steps, axis=-1, ddof=1) if num_walks > 1 else jnp.zeros(steps.shape[:-1], Q.dtype)
    stderr = (jnp.sqrt(jnp.sum(var_i, axis=-1) / num_walks) / T).reshape(batch)
    return est, stderr


# --------------------------------------------------------------------------- #
# Fidelity
# --------------------------------------------------------------------------- #
@partial(jax.jit, static_argnames=("horizon",))
def sink_signals(A, horizon: int = 100) -> Array:
    """``s[t-1] = (A^t)[T-1, :]`` for t = 1..horizon: ``(..., T, T) -> (horizon, ..., T)``.

    The signal of every node at the sink after t steps of diffusion. Only the sink row of the
    powers is needed, so the row vector ``r_t = e_tau^T A^t`` is propagated (``r_{t+1} = r_t A``)
    with a scan; float64 in, float64 out when x64 is enabled (see :func:`sink_signals_float64`).
    """
    A = _as_float(A)
    r1 = A[..., -1, :]  # t = 1

    def step(r, _):
        nxt = jnp.einsum("...j,...jk->...k", r, A, precision=_HI)
        return nxt, nxt

    _, rest = jax.lax.scan(step, r1, None, length=horizon - 1)  # t = 2..horizon
    return jnp.concatenate([r1[None], rest]) if horizon > 1 else r1[None]


def sink_signals_float64(A, horizon: int = 100) -> np.ndarray:
    """:func:`sink_signals` in float64 on the host, for figures and small exact examples."""
    with jax.enable_x64(True):
        return np.asarray(sink_signals(jnp.asarray(np.asarray(A, np.float64)), horizon))


def node_fidelity(A, horizon: int = 100) -> Array:
    """``phi_j = max_{1 <= t <= horizon} (A^t)[T-1, j]``: ``(..., T, T) -> (..., T)``."""
    return jnp.max(sink_signals(A, horizon), axis=0)


def minimax_fidelity(A, horizon: int = 100, include_sink: bool = True) -> Array:
    """``phi_min = min_j phi_j`` as a fraction in [0, 1]: ``(..., T, T) -> (...)``.

    ``include_sink=True`` (reference-compatible) also takes the sink's own
    entry, which caps the value at ``A[tau, tau]``; ``False`` uses j < T-1 only.
    """
    phi = node_fidelity(A, horizon)
    if not include_sink:
        phi = phi[..., :-1]
    return jnp.min(phi, axis=-1)


def synergy(attn, beta, horizon: int = 100, include_sink: bool = True) -> dict[str, Array]:
    """Combined operator vs each head alone (weight 1). attn ``(..., H, T, T)``, beta ``(..., H)``.

    Returns a dict of ``(...)`` arrays: ``combined`` (phi_min of ``A_bar``),
    ``best_single`` (max over heads of each head's phi_min),
    ``combined_beats_best`` (bool, strict >), and ``per_head`` ``(..., H)``.
    """
    attn = _as_float(attn)
    per_head = minimax_fidelity(attn, horizon, include_sink)
    combined = minimax_fidelity(combine(attn, beta), horizon, include_sink)
    best = jnp.max(per_head, axis=-1)
    return {
        "combined": combined,
        "best_single": best,
        "combined_beats_best": combined > best,
        "per_head": per_head,
    }
