"""Tests for NTK Gram, simplex margin, Lanczos and GD rate (arXiv 2310.12680)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree
from scipy.optimize import minimize

from mhjax.analysis.ntk import (
    grad_loss_ratio,
    hessian_extreme_eigs,
    linear_margin,
    ntk_gram,
    ntk_gram_bruteforce,
    simplex_margin,
)
from mhjax.models.classifier import classifier_apply, head_mask_for, init_params, logistic_loss


class Cfg:
    dim, seq_len = 3, 3


def tiny_model(query="full", hmax=3, H=2, seed=0):
    params = init_params(jax.random.PRNGKey(seed), Cfg, hmax, "random", 0.7, query=query)
    mask = head_mask_for(H, hmax)
    apply_fn = lambda p, x: classifier_apply(p, x, mask, H)
    return params, apply_fn, mask


# ---------------------------------------------------------------- NTK Gram


@pytest.mark.parametrize("query", ["full", "first"])
def test_ntk_gram_matches_explicit_jacobian(query):
    params, apply_fn, _ = tiny_model(query)
    X = jax.random.normal(jax.random.PRNGKey(1), (7, Cfg.seq_len, Cfg.dim))
    K_ref = np.asarray(jax.jit(lambda p: ntk_gram_bruteforce(apply_fn, p, X))(params))
    # Independent check of the reference: Jacobian from forward-mode AD.
    f_all = lambda p: jax.vmap(apply_fn, in_axes=(None, 0))(p, X)
    flat, unravel = ravel_pytree(params)
    J = np.asarray(jax.jit(jax.jacfwd(lambda z: f_all(unravel(z))))(flat))
    np.testing.assert_allclose(K_ref, J @ J.T, rtol=1e-4, atol=1e-5)
    # chunk sizes 3 and 4 do not divide n = 7; 10 > n
    for chunk, materialize in ((3, True), (10, True), (4, False), (1, False)):
        K = ntk_gram(apply_fn, params, X, chunk_size=chunk, materialize_jacobian=materialize)
        assert K.shape == (7, 7)
        np.testing.assert_allclose(K, K_ref, rtol=1e-4, atol=1e-5)


def test_ntk_gram_linear_model_is_input_gram():
    X = jax.random.normal(jax.random.PRNGKey(2), (5, 4))
    w = jnp.ones(4)
    K = ntk_gram(lambda w, x: jnp.dot(w, x), w, X, chunk_size=2)
    np.testing.assert_allclose(K, X @ X.T, rtol=1e-5, atol=1e-5)


def test_masked_heads_do_not_enter_ntk():
    params, apply_fn, _ = tiny_model(hmax=4, H=2)
    X = jax.random.normal(jax.random.PRNGKey(3), (5, Cfg.seq_len, Cfg.dim))
    small = jax.tree_util.tree_map(lambda p: p[:2], params)
    K_small = ntk_gram(lambda p, x: classifier_apply(p, x, jnp.ones(2), 2), small, X)
    np.testing.assert_allclose(ntk_gram(apply_fn, params, X), K_small, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- margins


def scipy_dual_value(K, y):
    """min_{a in simplex} a^T G a with SLSQP (generic solver)."""
    G = K * np.outer(y, y)
    n = len(y)
    res = minimize(
        lambda a: a @ G @ a,
        np.full(n, 1 / n),
        jac=lambda a: 2 * G @ a,
        method="SLSQP",
        bounds=[(0, 1)] * n,
        constraints=[{"type": "eq", "fun": lambda a: a.sum() - 1, "jac": lambda a: np.ones(n)}],
        options={"ftol": 1e-15, "maxiter": 1000},
    )
    return res.fun


def scipy_primal_margin(F, y, w0):
    """Hard-margin SVM through the origin: min |w|^2 s.t. y_i <w, f_i> >= 1,
    started from a feasible w0."""
    w0 = w0 / np.min(y * (F @ w0))
    res = minimize(
        lambda w: w @ w,
        w0,
        jac=lambda w: 2 * w,
        method="SLSQP",
        constraints=[{"type": "ineq", "fun": lambda w: y * (F @ w) - 1, "jac": lambda w: y[:, None] * F}],
        options={"ftol": 1e-12, "maxiter": 1000},
    )
    assert res.success, res.message
    return 1.0 / np.linalg.norm(res.x)


def separable_set(n, d, seed, min_margin=0.05):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=d)
    w /= np.linalg.norm(w)
    F = rng.normal(size=(4 * n, d))
    s = F @ w
    F = F[np.abs(s) > min_margin][:n]
    return F, np.sign(F @ w), w


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_margin_matches_scipy_separable(seed):
    F, y, w = separable_set(30, 5, seed)
    margin, gap = simplex_margin(F @ F.T, y)
    assert margin > 0 and 0 <= gap <= 1e-6 * margin
    np.testing.assert_allclose(margin, scipy_primal_margin(F, y, w), rtol=1e-4)
    np.testing.assert_allclose(margin**2, scipy_dual_value(F @ F.T, y), rtol=1e-3)


@pytest.mark.parametrize("seed", [0, 1])
def test_margin_non_separable(seed):
    rng = np.random.default_rng(seed)
    F = rng.normal(size=(40, 3))
    y = np.where(rng.random(40) < 0.5, 1.0, -1.0)  # random labels, n >> d
    K = F @ F.T
    assert scipy_dual_value(K, y) < 1e-8  # 0 in the hull
    margin, gap, info = simplex_margin(K, y, return_info=True)
    assert margin <= 0
    assert info["upper"] <= 1e-6 * info["radius"]
    assert info["converged"]


def test_margin_hand_made():
    # +-(1, 0) with labels +-1: both y_i x_i = (1, 0) -> margin 1.
    F = np.array([[1.0, 0.0], [-1.0, 0.0]])
    y = np.array([1.0, -1.0])
    margin, gap = simplex_margin(F @ F.T, y)
    assert margin == pytest.approx(1.0, abs=1e-9) and gap == pytest.approx(0, abs=1e-9)
    # two positive points at angle theta: margin = cos(theta / 2).
    for theta in (0.3, math.pi / 2, 2.5):
        F = np.array([[1.0, 0.0], [math.cos(theta), math.sin(theta)]])
        margin, gap = simplex_margin(F @ F.T, np.ones(2))
        assert margin == pytest.approx(math.cos(theta / 2), rel=1e-6)
    # points at angle > pi with the same label cannot be separated through 0
    F = np.array([[1.0, 0.0], [-1.0, 0.0]])
    margin, _ = simplex_margin(F @ F.T, np.ones(2))
    assert margin <= 0
    # three points: (2,0),(0,2) positive, (-1,-1)... known margin = sqrt(2)
    F = np.array([[2.0, 0.0], [0.0, 2.0], [-1.0, -1.0]])
    y = np.array([1.0, 1.0, -1.0])
    margin, _ = simplex_margin(F @ F.T, y)
    assert margin == pytest.approx(math.sqrt(2), rel=1e-6)


def test_linear_margin_features():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(12, 3, 2))
    y = np.where(rng.random(12) < 0.5, 1.0, -1.0)
    Ff, Fm = X.reshape(12, -1), X.mean(1)
    assert linear_margin(X, y, "flatten") == pytest.approx(simplex_margin(Ff @ Ff.T, y))
    assert linear_margin(X, y, "mean") == pytest.approx(simplex_margin(Fm @ Fm.T, y))
    # mean token: tokens (1,0),(3,0) for y=+1 -> mean (2,0); mirrored for -1.
    X = np.array([[[1.0, 0.0], [3.0, 0.0]], [[-1.0, 0.0], [-3.0, 0.0]]])
    y = np.array([1.0, -1.0])
    assert linear_margin(X, y, "mean")[0] == pytest.approx(2.0)
    assert linear_margin(X, y, "flatten")[0] == pytest.approx(math.sqrt(10))


# ---------------------------------------------------------------- Hessian


def test_lanczos_matches_dense_hessian():
    params, _, mask = tiny_model(hmax=2, H=2, seed=4)
    X = jax.random.normal(jax.random.PRNGKey(5), (6, Cfg.seq_len, Cfg.dim))
    y = jnp.array([1.0, -1.0, 1.0, 1.0, -1.0, -1.0])
    loss_fn = lambda p: logistic_loss(p, X, y, mask, 2)
    flat, unravel = ravel_pytree(params)
    Hd = np.asarray(jax.jit(jax.hessian(lambda z: loss_fn(unravel(z))))(flat), np.float64)
    eigs = np.linalg.eigvalsh((Hd + Hd.T) / 2)
    P = flat.size
    lo, hi = jax.jit(lambda p: hessian_extreme_eigs(loss_fn, p, num_iters=P))(params)
    scale = np.abs(eigs).max()
    assert float(lo) == pytest.approx(eigs[0], abs=1e-4 * scale)
    assert float(hi) == pytest.approx(eigs[-1], abs=1e-4 * scale)
    assert eigs[0] < 0 < eigs[-1]  # a real non-convex test case


def test_lanczos_quadratic_partial_and_breakdown():
    rng = np.random.default_rng(0)
    Q, _ = np.linalg.qr(rng.normal(size=(60, 60)))
    spec = np.concatenate([[-3.0], np.linspace(-1, 1, 58), [5.0]])
    A = jnp.asarray((Q * spec) @ Q.T, jnp.float32)
    loss = lambda p: 0.5 * p["z"] @ A @ p["z"]
    lo, hi = hessian_extreme_eigs(loss, {"z": jnp.zeros(60)}, num_iters=30, key=jax.random.PRNGKey(1))
    assert float(lo) == pytest.approx(-3.0, abs=1e-3)
    assert float(hi) == pytest.approx(5.0, abs=1e-3)
    # Only 3 distinct eigenvalues: Krylov space has dim 3, Lanczos breaks down
    # and must restart to find the rest; extremes still exact.
    D = jnp.asarray(np.repeat([-2.0, 0.5, 4.0], [3, 10, 7]), jnp.float32)
    loss = lambda z: 0.5 * jnp.sum(D * z**2)
    lo, hi = hessian_extreme_eigs(loss, jnp.zeros(20), num_iters=20)
    assert float(lo) == pytest.approx(-2.0, abs=1e-4)
    assert float(hi) == pytest.approx(4.0, abs=1e-4)


def test_grad_loss_ratio():
    X = jnp.asarray(np.random.default_rng(0).normal(size=(8, 3)), jnp.float32)
    y = jnp.sign(X[:, 0])
    loss_fn = lambda w: jnp.mean(jax.nn.softplus(-y * (X @ w)))
    w = jnp.array([0.5, -0.2, 0.1])
    r = grad_loss_ratio(loss_fn, w)
    expect = jnp.linalg.norm(jax.grad(loss_fn)(w)) / loss_fn(w)
    assert float(r) == pytest.approx(float(expect), rel=1e-6)


# ---------------------------------------------------------------- GD rate


def loglog_slope(losses, k1=100, k2=1000):
    return math.log(losses[k2 - 1] / losses[k1 - 1]) / math.log(k2 / k1)


def test_gd_linear_separable_loss_rate_one_over_k():
    F, y, _ = separable_set(40, 2, seed=3, min_margin=0.2)
    F, y = jnp.asarray(F, jnp.float32), jnp.asarray(y, jnp.float32)
    loss_fn = lambda w: jnp.mean(jax.nn.softplus(-y * (F @ w)))

    def step(w, _):
        loss, g = jax.value_and_grad(loss_fn)(w)
        return w - 1.0 * g, loss

    _, losses = jax.jit(lambda w: jax.lax.scan(step, w, None, length=1000))(jnp.zeros(2))
    losses = np.asarray(losses)
    assert np.all(np.diff(losses) <= 1e-7)
    assert -1.25 < loglog_slope(losses) < -0.8


def test_gd_classifier_on_easy_mixture_rate():
    from mhjax.data.mixture import default_mixture_config, sample_mixture

    cfg = default_mixture_config()
    cfg.dim, cfg.seq_len, cfg.noise_std = 8, 4, 0.5  # easy, separable
    X, y = sample_mixture(jax.random.PRNGKey(0), cfg, 32)
    H, hmax = 2, 4
    mask = head_mask_for(H, hmax)
    params = init_params(None, cfg, hmax, "zero")
    loss_fn = lambda p: logistic_loss(p, X, y, mask, H)

    def step(p, _):
        loss, g = jax.value_and_grad(loss_fn)(p)
        return jax.tree_util.tree_map(lambda a, b: a - 1.0 * b, p, g), loss

    _, losses = jax.jit(lambda p: jax.lax.scan(step, p, None, length=1000))(params)
    losses = np.asarray(losses)
    assert losses[-1] < 1e-2
    assert -1.4 < loglog_slope(losses) < -0.7
