"""NTK, margin and curvature diagnostics of arXiv 2310.12680 (Deora et al.), in jax.numpy.

* ``ntk_gram`` / ``ntk_gram_bruteforce``: empirical NTK Gram
  K_ij = <grad_theta f(x_i), grad_theta f(x_j)>.
* ``simplex_margin``: hard-margin SVM through the origin from a Gram matrix
  via its dual over the simplex (numpy float64, pairwise Frank-Wolfe).
* ``linear_margin``: the same for a linear classifier on raw inputs.
* ``hessian_extreme_eigs``: Lanczos on Hessian-vector products.
* ``grad_loss_ratio``: ||grad L|| / L (self-boundedness).
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

# --------------------------------------------------------------------------
# NTK Gram
# --------------------------------------------------------------------------


def _flat_grad_fn(apply_fn: Callable, params):
    """x -> grad_theta apply_fn(params, x) flattened to (P,)."""

    def flat_grad(x):
        return ravel_pytree(jax.grad(apply_fn)(params, x))[0]

    return flat_grad


def _pad_to_chunks(X: jax.Array, chunk_size: int):
    """Pad the example axis to a multiple of chunk_size (copies of X[0], so
    padded rows are valid inputs); returns (n_chunks, chunk_size, ...)."""
    n = X.shape[0]
    n_chunks = -(-n // chunk_size)
    pad = n_chunks * chunk_size - n
    if pad:
        X = jnp.concatenate([X, jnp.broadcast_to(X[:1], (pad,) + X.shape[1:])])
    return X.reshape((n_chunks, chunk_size) + X.shape[1:])


def ntk_gram(
    apply_fn: Callable, params, X: jax.Array, chunk_size: int = 64, materialize_jacobian: bool = True
) -> jax.Array:
    """Empirical NTK Gram matrix, chunked over examples.

    Args:
      apply_fn: (params, x_single) -> scalar.
      params: pytree with P scalars in total.
      X: (n, ...) examples.
      chunk_size: examples per vmapped per-example-gradient batch (c).
      materialize_jacobian: if True (default), the flattened Jacobian J (n, P)
        is built chunk by chunk and K = J J^T. Memory: n*P floats for J plus
        c * (per-example backward activations) plus n^2 for K; gradients cost
        n backward passes.
        If False, J is never stored: K is assembled block by block,
        K_IJ = J_I J_J^T, recomputing the column chunk's gradients for every
        row chunk. Memory: 2*c*P + c * (activations) + n^2; cost
        n^2 / c backward passes (n / c times more). Use it when n*P does not
        fit.

    Returns:
      K: (n, n) float32 (dtype of the gradients), symmetric PSD.
    """
    n = X.shape[0]
    c = max(1, min(int(chunk_size), n))
    flat_grad = _flat_grad_fn(apply_fn, params)
    chunks = _pad_to_chunks(X, c)  # (nc, c, ...)
    chunk_jac = jax.vmap(flat_grad)  # (c, ...) -> (c, P)
    if materialize_jacobian:
        J = jax.lax.map(chunk_jac, chunks)  # (nc, c, P)
        J = J.reshape(-1, J.shape[-1])[:n]
        return J @ J.T

    def row_block(rows):  # -> (c, nc * c)
        j_rows = chunk_jac(rows)
        blocks = jax.lax.map(lambda cols: j_rows @ chunk_jac(cols).T, chunks)
        return jnp.transpose(blocks, (1, 0, 2)).reshape(c, -1)

    K = jax.lax.map(row_block, chunks)  # (nc, c, nc * c)
    return K.reshape(-1, K.shape[-1])[:n, :n]


def ntk_gram_bruteforce(apply_fn: Callable, params, X: jax.Array) -> jax.Array:
    """Reference: explicit Jacobian J (n, P) with jax.jacrev, K = J J^T."""

    def f_all(p):
        return jax.vmap(apply_fn, in_axes=(None, 0))(p, X)

    jac = jax.jacrev(f_all)(params)  # pytree of (n, ...)
    n = X.shape[0]
    J = jnp.concatenate([leaf.reshape(n, -1) for leaf in jax.tree_util.tree_leaves(jac)], axis=1)
    return J @ J.T


# --------------------------------------------------------------------------
# Hard margin through the origin from a Gram matrix
# --------------------------------------------------------------------------


def simplex_margin(
    gram, y, num_iters: int = 100_000, tol: float = 1e-6, zero_tol: float = 1e-9, return_info: bool = False
):
    """Hard-margin SVM (through the origin) margin from a Gram matrix.

    Primal:  gamma = max_{|v|=1} min_i y_i <g_i, v>.
    Dual:    gamma = min_{a in simplex} ||w(a)||,  w(a) = sum_i a_i y_i g_i,
             when gamma > 0 (separable), and min ||w(a)|| = 0 otherwise.
    With G = diag(y) K diag(y), ||w(a)||^2 = a^T G a and, for v = w/||w||,
    y_i <g_i, v> = (G a)_i / sqrt(a^T G a). Every iterate a therefore gives
    two rigorous bounds, from K alone:

      lower(a) = min_i (G a)_i / sqrt(a^T G a)  <=  gamma        (primal, v(a))
      upper(a) = sqrt(a^T G a)                  >=  gamma        (weak duality)

    Returned values (one definition, used everywhere):
      margin = lower(a) at the final iterate: the margin achieved by the explicit
        unit direction v(a), so margin > 0 *certifies* separability;
      gap = upper(a) - lower(a) >= 0, so gamma lies in [margin, margin + gap].
    On separable data the solver drives gap -> 0 (at the optimum
    (G a)_i >= a^T G a for all i, with equality on the support), so
    margin -> gamma. On non-separable data a^T G a -> 0, gamma <= 0, and the
    returned margin is <= 0 (a lower bound on the true, non-positive gamma;
    its exact value there is not meaningful, only its sign); the loop stops
    as soon as upper <= zero_tol * R, R = max_i ||g_i|| (0 is in the convex
    hull of the y_i g_i to that tolerance).

    Solver: pairwise Frank-Wolfe on the simplex with exact line search
    (linear convergence on polytopes), numpy float64, O(n) per iteration;
    G a is recomputed every 1000 iterations to avoid drift.

    Args:
      gram: (n, n) PSD Gram matrix K (any array type; converted to float64).
      y: (n,) labels in {-1, +1}.
      num_iters: iteration cap.
      tol: stop when gap <= tol * upper (relative accuracy of the margin).
      zero_tol: stop (non-separable) when upper <= zero_tol * R.
      return_info: also return a dict with 'weights' a (n,), 'upper',
        'sq_norm' a^T G a, 'radius' R, 'iters', 'converged' (a stopping rule
        was met before num_iters), 'separable' (margin > 0: certified).

    Cost: O(n) per iteration after forming G (O(n^2)); iterations grow with
    the number of support vectors and with 1/margin (e.g. ~1e4 iterations,
    ~1 s, for n=1000 generic points in R^2000). When num_iters runs out the
    returned pair is still a valid bracket gamma in [margin, margin + gap].

    Returns:
      (margin, gap) floats, or (margin, gap, info) if return_info.
    """
    K = np.asarray(gram, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    n = K.shape[0]
    G = K * np.outer(y, y)
    diag = np.diag(G).copy()
    radius = math.sqrt(max(float(diag.max()), 0.0))
    if radius == 0.0:  # all features zero: nothing separates
        margin, gap, a, q, iters, converged = 0.0, 0.0, np.full(n, 1 / n), 0.0, 0, True
    else:
        a = np.full(n, 1.0 / n)
        Ga = G @ a
        converged, iters = False, 0
        for iters in range(1, num_iters + 1):
            q = max(float(a @ Ga), 0.0)
            s = int(np.argmin(Ga))  # FW (toward) vertex
            upper = math.sqrt(q)
            if upper <= zero_tol * radius:  # 0 in the hull: not separable
                converged = True
                break
            lower = Ga[s] / upper
            if upper - lower <= tol * upper:
                converged = True
                break
            active = np.flatnonzero(a > 0)
            v = int(active[np.argmax(Ga[active])])  # away vertex
            if v == s:
                break
            # Exact line search for f(a + t (e_s - e_v)) = a^T G a + ...
            curv = G[s, s] + G[v, v] - 2.0 * G[s, v]
            slope = Ga[v] - Ga[s]  # > 0 unless converged
            t = a[v] if curv <= 0 else min(slope / curv, a[v])
            a[s] += t
            a[v] -= t
            if a[v] <= 1e-16:
                a[v] = 0.0
            if iters % 1000 == 0:
                a = np.maximum(a, 0.0)
                a /= a.sum()
                Ga = G @ a
            else:
                Ga += t * (G[:, s] - G[:, v])
        q = max(float(a @ G @ a), 0.0)
        Ga = G @ a
        upper = math.sqrt(q)
        if upper > 0:
            margin = float(Ga.min() / upper)
        else:
            margin = 0.0
        gap = upper - margin
    if return_info:
        info = dict(
            weights=a,
            upper=math.sqrt(q),
            sq_norm=q,
            radius=radius,
            iters=iters,
            converged=converged,
            separable=margin > 0,
        )
        return margin, gap, info
    return margin, gap


def linear_margin(X, y, features: str = "flatten", **solver_kwargs):
    """Hard margin (through the origin) of a linear classifier on raw inputs.

    features="flatten": x -> vec(X) in R^{T d};  "mean": x -> mean token in R^d.
    X: (n, T, d), y: (n,). Solved by ``simplex_margin`` on the features' Gram
    matrix (float64); returns its (margin, gap[, info]).
    Note: margins are scale-dependent; compare feature maps through
    margin / radius (radius = max_i ||feature_i||, in ``info``).
    """
    X = np.asarray(X, dtype=np.float64)
    if features == "flatten":
        F = X.reshape(X.shape[0], -1)
    elif features == "mean":
        F = X.mean(axis=1)
    else:
        raise ValueError(f"features must be 'flatten' or 'mean', got {features!r}")
    return simplex_margin(F @ F.T, y, **solver_kwargs)


# --------------------------------------------------------------------------
# Curvature and self-boundedness
# --------------------------------------------------------------------------


def hessian_extreme_eigs(
    loss_fn: Callable, params, num_iters: int = 64, key: jax.Array | None = None, breakdown_tol: float = 1e-6
):
    """(lambda_min, lambda_max) of the Hessian of loss_fn at params, by Lanczos.

    Hessian-vector products are forward-over-reverse (jax.jvp of jax.grad) on
    the raveled parameters, so the Hessian is never formed. Full
    reorthogonalisation (twice, classical Gram-Schmidt) against all previous
    Lanczos vectors: memory (m+1) * P floats, m = min(num_iters, P). On
    breakdown (beta < breakdown_tol * |H|-scale) the recursion restarts from
    a fresh random vector orthogonal to the basis, with beta stored as 0 (T
    becomes block diagonal, still exact). With m = P the Ritz values are the
    exact eigenvalues; for m << P the extreme ones converge first.
    Jittable and vmappable (all loops are lax loops).

    Args:
      loss_fn: params -> scalar.
      params: pytree.
      num_iters: Lanczos steps m (capped at P).
      key: PRNG key for the start vector (default PRNGKey(0)).

    Returns:
      (lambda_min, lambda_max) as scalars of the parameter dtype.
    """
    if key is None:
        key = jax.random.PRNGKey(0)
    flat, unravel = ravel_pytree(params)
    P = flat.shape[0]
    m = int(min(num_iters, P))
    grad_flat = jax.grad(lambda z: loss_fn(unravel(z)))

    def hvp(v):
        return jax.jvp(grad_flat, (flat,), (v,))[1]

    def orthogonalize(w, V):
        for _ in range(2):  # twice is enough
            w = w - V.T @ (V @ w)
        return w

    def random_unit(k, V):
        w = orthogonalize(jax.random.normal(k, (P,), flat.dtype), V)
        return w / jnp.maximum(jnp.linalg.norm(w), jnp.finfo(w.dtype).tiny)

    V = jnp.zeros((m + 1, P), flat.dtype)
    V = V.at[0].set(random_unit(key, V))
    alphas = jnp.zeros((m,), flat.dtype)
    betas = jnp.zeros((m,), flat.dtype)  # betas[j] couples j and j + 1

    def body(j, carry):
        V, alphas, betas, scale = carry
        v = V[j]
        w = hvp(v)
        alpha = jnp.dot(w, v)
        w = orthogonalize(w, V)  # removes alpha v and beta v_{j-1}
        beta = jnp.linalg.norm(w)
        scale = jnp.maximum(scale, jnp.abs(alpha) + beta)
        broke = beta <= breakdown_tol * scale
        fresh = random_unit(jax.random.fold_in(key, j + 1), V)
        v_next = jnp.where(broke, fresh, w / jnp.where(broke, 1.0, beta))
        V = V.at[j + 1].set(v_next)
        alphas = alphas.at[j].set(alpha)
        betas = betas.at[j].set(jnp.where(broke, 0.0, beta))
        return V, alphas, betas, scale

    V, alphas, betas, _ = jax.lax.fori_loop(0, m, body, (V, alphas, betas, jnp.zeros((), flat.dtype)))
    T = jnp.diag(alphas) + jnp.diag(betas[:-1], 1) + jnp.diag(betas[:-1], -1)
    ritz = jnp.linalg.eigvalsh(T)
    return ritz[0], ritz[-1]


def grad_loss_ratio(loss_fn: Callable, params):
    """||grad L(params)|| / L(params) (self-boundedness ratio; scalar)."""
    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jnp.linalg.norm(ravel_pytree(grads)[0]) / loss
