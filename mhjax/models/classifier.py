"""Single-layer multi-head attention classifier Phi (spec §1), pure jax.numpy.

  full (default):  Phi(X) = 1/sqrt(H) * sum_h < U_h , softmax_rows(X W_h X^T) X >
                   W_h: (d, d), U_h: (T, d)
  first (variant): Phi(X) = 1/sqrt(H) * sum_h U_h^T X^T softmax(X W_h x_1)
                   W_h: (d, d), U_h: (d,)

No MLP, norm, residual, positions or 1/sqrt(d) score scaling (as in the spec).

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
INITS = ("zero", "random")


def init_classifier(key: jax.Array, cfg: Any, max_heads: int,
                    scale: float = 1.0, *, init: str = "zero",
                    query: str = "full") -> dict:
    """Parameters for ``max_heads`` heads (cfg provides ``dim`` and ``seq_len``).

    init="zero": all zeros (the spec's default theta_0 is zero init followed by
      one full-batch GD step, done by the trainer, e.g. with ``gd_step``).
    init="random" (variant): every entry of W and U i.i.d. N(0, scale^2).
    """
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    if query not in QUERIES:
        raise ValueError(f"query must be one of {QUERIES}, got {query!r}")
    d, t = int(cfg.dim), int(cfg.seq_len)
    w_shape = (max_heads, d, d)
    u_shape = (max_heads, t, d) if query == "full" else (max_heads, d)
    if init == "zero":
        return {"W": jnp.zeros(w_shape, jnp.float32),
                "U": jnp.zeros(u_shape, jnp.float32)}
    k_w, k_u = jax.random.split(key)
    return {"W": scale * jax.random.normal(k_w, w_shape, jnp.float32),
            "U": scale * jax.random.normal(k_u, u_shape, jnp.float32)}


def head_mask_for(num_heads, max_heads: int) -> jax.Array:
    """(max_heads,) float32 mask with ones on the first ``num_heads`` heads."""
    return (jnp.arange(max_heads) < num_heads).astype(jnp.float32)


def _infer_query(params: dict, query: Optional[str]) -> str:
    inferred = "full" if params["U"].ndim == 3 else "first"
    if query is None:
        return inferred
    if query != inferred:
        raise ValueError(
            f"query={query!r} but U has shape {params['U'].shape}"
            f" (that is the {inferred!r} variant)")
    return query


def _phi_single(params: dict, x: jax.Array, head_mask: jax.Array,
                num_heads, query: str) -> jax.Array:
    """Phi for one example x: (T, d) -> scalar."""
    mask = head_mask.astype(x.dtype)
    # Masking the parameters (not only the outputs) makes the gradient of a
    # masked head exactly 0 * finite = 0.
    w = params["W"] * mask[:, None, None]
    if query == "full":
        u = params["U"] * mask[:, None, None]
        scores = jnp.einsum("td,hde,se->hts", x, w, x)        # (H, T, T)
        attn = jax.nn.softmax(scores, axis=-1)
        heads = jnp.einsum("hts,sd->htd", attn, x)            # (H, T, d)
        contrib = jnp.einsum("htd,htd->h", u, heads)          # (H,)
    else:
        u = params["U"] * mask[:, None]
        scores = jnp.einsum("td,hde,e->ht", x, w, x[0])       # (H, T)
        attn = jax.nn.softmax(scores, axis=-1)
        heads = jnp.einsum("ht,td->hd", attn, x)              # (H, d)
        contrib = jnp.einsum("hd,hd->h", u, heads)            # (H,)
    scale = jax.lax.rsqrt(jnp.asarray(num_heads, x.dtype))
    return scale * jnp.sum(mask * contrib)


def classifier_apply(params: dict, X: jax.Array, head_mask: jax.Array,
                     num_heads=None, query: Optional[str] = None) -> jax.Array:
    """Phi(theta; X).

    Args:
      params: {'W': (Hmax, d, d), 'U': (Hmax, T, d) or (Hmax, d)}.
      X: (T, d) one example -> scalar, or (n, T, d) -> (n,).
      head_mask: (Hmax,) 0/1 (float/bool/int); 1 = head is active.
      num_heads: the member's H for the 1/sqrt(H) scale (int or traced
        scalar); default sum(head_mask).
      query: "full" | "first" | None (inferred from U.ndim; static).
    """
    query = _infer_query(params, query)
    head_mask = jnp.asarray(head_mask)
    if num_heads is None:
        num_heads = jnp.sum(head_mask.astype(jnp.float32))
    if X.ndim == 2:
        return _phi_single(params, X, head_mask, num_heads, query)
    return jax.vmap(_phi_single, in_axes=(None, 0, None, None, None))(
        params, X, head_mask, num_heads, query)


def logistic_loss(params: dict, X: jax.Array, y: jax.Array,
                  head_mask: jax.Array, num_heads=None,
                  query: Optional[str] = None) -> jax.Array:
    """Empirical risk mean_i softplus(-y_i Phi(X_i)); X: (n, T, d), y: (n,)."""
    phi = classifier_apply(params, X, head_mask, num_heads, query)
    return jnp.mean(jax.nn.softplus(-y * phi))


def gd_step(params: dict, X: jax.Array, y: jax.Array, eta,
            head_mask: jax.Array, num_heads=None,
            query: Optional[str] = None):
    """One full-batch plain GD step on ``logistic_loss``: (new_params, loss)."""
    loss, grads = jax.value_and_grad(logistic_loss)(
        params, X, y, head_mask, num_heads, query)
    new = jax.tree_util.tree_map(lambda p, g: p - eta * g, params, grads)
    return new, loss
