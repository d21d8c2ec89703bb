"""Single-layer multi-head attention classifier Phi of arXiv 2310.12680 (Deora et al.), pure jax.numpy.

  full (default):  Phi(X) = 1/sqrt(H) * sum_h < U_h , softmax_rows(X W_h X^T) X >
                   W_h: (d, d), U_h: (T, d)
  first (variant): Phi(X) = 1/sqrt(H) * sum_h U_h^T X^T softmax(X W_h x_1)
                   W_h: (d, d), U_h: (d,)

No MLP, norm, residual, positions or 1/sqrt(d) score scaling (as in the paper's model).

Sweeps over H in one program: parameters are padded to ``Hmax`` heads and a
member's head count enters only through ``head_mask`` (Hmax,) of 0/1 and the
scalar ``num_heads`` (may be traced). Masked heads are zeroed *in the
parameters* before use, so they contribute exactly 0 and get exactly zero
gradient; the output scale 1/sqrt(H) uses the member's own H. Members with
different H therefore share every shape.

Params are a plain dict {'W': (Hmax, d, d), 'U': (Hmax, T, d) | (Hmax, d)};
the query variant is inferred from U.ndim unless given.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp

QUERIES = ("full", "first")
# theta_0 before the optional first GD step (the trainer takes that step; see ``gd_step``).
INIT_SCHEMES = ("random_decoders", "antisymmetric", "zero", "random")


def init_params(
    key: jax.Array,
    cfg: Any,
    max_heads: int,
    scheme: str = "random_decoders",
    tau: float = 1.0,
    *,
    query: str = "full",
    head_mask=None,
) -> dict:
    """Parameters for ``max_heads`` heads (cfg provides ``dim`` and ``seq_len``).

    Head h's random values come from fold_in(key, h), so they do not depend on
    ``max_heads`` (a member draws the same heads in any sweep). Schemes:
      * "random_decoders": W_h = 0, U_h ~ N(0, tau^2) entrywise, independent per head. With
        W = 0 every head attends uniformly, so Phi(theta_0; X) = <sum_h U_h, mean token>/sqrt(H)
        is a random linear function, but each head's gradient in W_h differs (it is multiplied
        by its own U_h), so GD moves the heads apart.
      * "antisymmetric": heads in pairs (2j, 2j+1) with U_{2j+1} = -U_{2j} ~ N(0, tau^2) drawn
        from fold_in(key, 2j), W = 0, so Phi(theta_0) = 0 exactly. With ``head_mask`` given,
        an active head whose partner is masked (the last head of an odd H) is set to zero.
      * "zero": all zeros (every head gets the same gradient forever: a degenerate start).
      * "random": every entry of W_h and U_h i.i.d. N(0, tau^2).
    Masked heads (``head_mask`` 0) are zero.
    """
    if scheme not in INIT_SCHEMES:
        raise ValueError(f"init scheme must be one of {INIT_SCHEMES}, got {scheme!r}")
    if query not in QUERIES:
        raise ValueError(f"query must be one of {QUERIES}, got {query!r}")
    d, t = int(cfg.dim), int(cfg.seq_len)
    u_head = (t, d) if query == "full" else (d,)
    W = jnp.zeros((max_heads, d, d), jnp.float32)
    U = jnp.zeros((max_heads,) + u_head, jnp.float32)
    heads = jnp.arange(max_heads)
    # Head h, part i (0: W, 1: U): its own key, whatever max_heads is.
    draw = lambda h, shape, i: tau * jax.random.normal(jax.random.fold_in(jax.random.fold_in(key, h), i), shape)
    if scheme == "random":
        W = jax.vmap(lambda h: draw(h, (d, d), 0))(heads)
        U = jax.vmap(lambda h: draw(h, u_head, 1))(heads)
    elif scheme == "random_decoders":
        U = jax.vmap(lambda h: draw(h, u_head, 1))(heads)
    elif scheme == "antisymmetric":
        sign = jnp.where(heads % 2 == 0, 1.0, -1.0)
        U = jax.vmap(lambda h: draw(h - h % 2, u_head, 1))(heads) * _per_head(sign, U)
        if head_mask is not None:  # a head whose partner is masked would leave Phi(theta_0) != 0
            mask = jnp.asarray(head_mask, jnp.float32)
            partner = mask[heads ^ 1] if max_heads % 2 == 0 else jnp.append(mask, 0.0)[heads ^ 1]
            U = U * _per_head(partner, U)
    if head_mask is not None:
        mask = jnp.asarray(head_mask, jnp.float32)
        W, U = W * _per_head(mask, W), U * _per_head(mask, U)
    return {"W": W, "U": U}


def _per_head(values, like):
    """(Hmax,) -> broadcastable against ``like`` (Hmax, ...)."""
    return values.reshape((-1,) + (1,) * (like.ndim - 1))


def head_mask_for(num_heads, max_heads: int) -> jax.Array:
    """(max_heads,) float32 mask with ones on the first ``num_heads`` heads."""
    return (jnp.arange(max_heads) < num_heads).astype(jnp.float32)


def _infer_query(params: dict, query: Optional[str]) -> str:
    inferred = "full" if params["U"].ndim == 3 else "first"
    if query is None:
        return inferred
    if query != inferred:
        raise ValueError(f"query={query!r} but U has shape {params['U'].shape} (that is the {inferred!r} variant)")
    return query


def softmax(scores):
    return jax.nn.softmax(scores, axis=-1)


def _phi_single(params: dict, x: jax.Array, head_mask: jax.Array, num_heads, query: str, phi=softmax) -> jax.Array:
    """Phi for one example x: (T, d) -> scalar; ``phi`` maps a row of scores to attention weights."""
    mask = head_mask.astype(x.dtype)
    # Masking the parameters (not only the outputs) makes the gradient of a
    # masked head exactly 0 * finite = 0.
    w = params["W"] * mask[:, None, None]
    if query == "full":
        u = params["U"] * mask[:, None, None]
        scores = jnp.einsum("td,hde,se->hts", x, w, x)  # (H, T, T)
        attn = phi(scores)
        heads = jnp.einsum("hts,sd->htd", attn, x)  # (H, T, d)
        contrib = jnp.einsum("htd,htd->h", u, heads)  # (H,)
    else:
        u = params["U"] * mask[:, None]
        scores = jnp.einsum("td,hde,e->ht", x, w, x[0])  # (H, T)
        attn = phi(scores)
        heads = jnp.einsum("ht,td->hd", attn, x)  # (H, d)
        contrib = jnp.einsum("hd,hd->h", u, heads)  # (H,)
    scale = jax.lax.rsqrt(jnp.asarray(num_heads, x.dtype))
    return scale * jnp.sum(mask * contrib)


def classifier_apply(
    params: dict, X: jax.Array, head_mask: jax.Array, num_heads=None, query: Optional[str] = None, phi=softmax
) -> jax.Array:
    """Phi(theta; X).

    Args:
      params: {'W': (Hmax, d, d), 'U': (Hmax, T, d) or (Hmax, d)}.
      X: (T, d) one example -> scalar, or (n, T, d) -> (n,).
      head_mask: (Hmax,) 0/1 (float/bool/int); 1 = head is active.
      num_heads: the member's H for the 1/sqrt(H) scale (int or traced
        scalar); default sum(head_mask).
      query: "full" | "first" | None (inferred from U.ndim; static).
      phi: attention weights from a row of scores, (..., T) -> (..., T) (default softmax).
    """
    query = _infer_query(params, query)
    head_mask = jnp.asarray(head_mask)
    if num_heads is None:
        num_heads = jnp.sum(head_mask.astype(jnp.float32))
    if X.ndim == 2:
        return _phi_single(params, X, head_mask, num_heads, query, phi)
    return jax.vmap(lambda x: _phi_single(params, x, head_mask, num_heads, query, phi))(X)


def logistic(z):
    return jax.nn.softplus(-z)


def margin_loss(
    params: dict,
    X: jax.Array,
    y: jax.Array,
    head_mask: jax.Array,
    num_heads=None,
    query: Optional[str] = None,
    weights=None,
    *,
    loss=logistic,
    phi=softmax,
) -> jax.Array:
    """Empirical risk mean_i loss(y_i Phi(X_i)); X: (n, T, d), y: (n,).

    ``weights`` (n,) of 0/1 (optional): the mean over the examples of weight 1 only, so a
    training set padded with zero-weight examples has the loss of the unpadded one. Padded
    examples are left out with ``where`` (their margin replaced by 0 before the loss, their loss
    by 0 after), never multiplied by 0: exp(-z) of a padded example may overflow, and 0 * inf is NaN."""
    z = y * classifier_apply(params, X, head_mask, num_heads, query, phi)
    if weights is None:
        return jnp.mean(loss(z))
    keep = weights > 0
    losses = jnp.where(keep, loss(jnp.where(keep, z, 0.0)), 0.0)
    return jnp.sum(losses) / jnp.sum(weights)


def logistic_loss(
    params: dict,
    X: jax.Array,
    y: jax.Array,
    head_mask: jax.Array,
    num_heads=None,
    query: Optional[str] = None,
    weights=None,
) -> jax.Array:
    """``margin_loss`` with the logistic loss softplus(-y Phi) and softmax attention."""
    return margin_loss(params, X, y, head_mask, num_heads, query, weights)


def gd_step(
    params: dict,
    X: jax.Array,
    y: jax.Array,
    eta,
    head_mask: jax.Array,
    num_heads=None,
    query: Optional[str] = None,
    weights=None,
    *,
    loss=logistic,
    phi=softmax,
):
    """One full-batch plain GD step on ``margin_loss``: (new_params, loss)."""
    value, grads = jax.value_and_grad(margin_loss)(
        params, X, y, head_mask, num_heads, query, weights, loss=loss, phi=phi
    )
    new = jax.tree_util.tree_map(lambda p, g: p - eta * g, params, grads)
    return new, value
