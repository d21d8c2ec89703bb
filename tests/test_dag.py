"""DAG analysis (mhjax.analysis.dag) against independent numpy brute force."""

import jax
import numpy as np
import pytest

from mhjax.analysis import dag
from mhjax.analysis.example2 import example2_operators
from mhjax.workflows.example2 import format_example2, run_example2


def random_causal(rng, T, density=0.6):
    """Row-stochastic lower-triangular matrix with random sparsity (diagonal kept)."""
    W = rng.exponential(size=(T, T)) * (rng.random((T, T)) < density)
    W = np.tril(W) + np.eye(T) * rng.random(T)
    return W / W.sum(axis=1, keepdims=True)


# ----------------------------- brute force ----------------------------------
def brute_reference_Q(A):
    """Spec §3 sampler, written with explicit loops."""
    T = A.shape[0]
    Q = np.zeros((T, T))
    for i in range(T):
        if i == T - 1:
            Q[i, i] = 1.0  # sink absorbing
            continue
        prev = 0.0
        running = 0.0
        for k in range(T - 1):
            running += A[k, i]
            c = min(1.0, running)
            Q[i, k] = c - prev
            prev = c
        Q[i, T - 1] = 1.0 - prev
    return Q


def brute_normalized_Q(A):
    T = A.shape[0]
    Q = np.zeros((T, T))
    for i in range(T - 1):
        col = A[:, i]
        Q[i] = col / col.sum() if col.sum() > 0 else np.eye(T)[T - 1]
    Q[T - 1, T - 1] = 1.0
    return Q


def brute_mixing(Q, max_steps):
    T = Q.shape[0]
    total = 0.0
    P = np.eye(T)
    for _ in range(max_steps):
        for i in range(T):
            total += 1.0 - P[i, T - 1]
        P = P @ Q
    return total / T


def brute_fidelity(A, horizon):
    T = A.shape[0]
    phi = np.zeros(T)
    P = np.eye(T)
    for _ in range(horizon):
        P = P @ A
        phi = np.maximum(phi, P[T - 1])
    return phi


# ------------------------------ mixing time ---------------------------------
@pytest.mark.parametrize("seed,T", [(0, 3), (1, 6), (2, 9), (3, 12)])
def test_mixing_time_matches_brute_force(seed, T):
    A = random_causal(np.random.default_rng(seed), T)
    for max_steps in (1, 5, 40):
        got = float(dag.mixing_time(A, max_steps=max_steps))
        want = brute_mixing(brute_reference_Q(A), max_steps)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        got_n = float(dag.mixing_time(A, max_steps=max_steps, chain="normalized"))
        want_n = brute_mixing(brute_normalized_Q(A), max_steps)
        np.testing.assert_allclose(got_n, want_n, rtol=1e-5, atol=1e-5)


def test_transition_matrix_matches_brute_force():
    A = random_causal(np.random.default_rng(7), 10)
    np.testing.assert_allclose(dag.transition_matrix(A), brute_reference_Q(A), atol=1e-6)
    np.testing.assert_allclose(dag.transition_matrix(A, "normalized"), brute_normalized_Q(A), atol=1e-6)
    np.testing.assert_allclose(np.sum(dag.transition_matrix(A), -1), 1.0, atol=1e-6)


@pytest.mark.parametrize("chain", ["reference", "normalized"])
def test_mixing_time_mc_agrees_within_sampling_error(chain):
    A = np.stack([random_causal(np.random.default_rng(s), 8) for s in (10, 11)])
    exact = np.asarray(dag.mixing_time(A, max_steps=30, chain=chain))
    est, se = dag.mixing_time_mc(
        jax.random.PRNGKey(0), A, max_steps=30, num_walks=2000, chain=chain, return_stderr=True
    )
    est, se = np.asarray(est), np.asarray(se)
    assert est.shape == se.shape == (2,)
    assert np.all(se > 0)
    assert np.all(np.abs(est - exact) < 4 * se), (est, exact, se)
    # seeded: same key, same answer
    again = dag.mixing_time_mc(jax.random.PRNGKey(0), A, max_steps=30, num_walks=2000, chain=chain)
    np.testing.assert_array_equal(np.asarray(again), est)


def test_sink_start_counts_zero_steps():
    # T=2: node 0's column [1, 0.5] clips to c_0 = 1, so the reference walk never
    # leaves node 0 (max_steps); the sink itself must add nothing.
    A = np.array([[1.0, 0.0], [0.5, 0.5]])
    assert float(dag.mixing_time(A, max_steps=100)) == pytest.approx(100 / 2)
    # normalized: leave node 0 w.p. 1/3 per step -> E[min(G, 100)] ~= 3
    expected = sum((2 / 3) ** s for s in range(100)) / 2
    assert float(dag.mixing_time(A, max_steps=100, chain="normalized")) == pytest.approx(expected, rel=1e-5)
    # a one-node graph is only the sink
    assert float(dag.mixing_time(np.ones((1, 1)))) == 0.0


def shift_chain(T):
    """0 -> 1 -> ... -> T-1: row i attends only to i-1 (row 0 to itself)."""
    A = np.zeros((T, T))
    A[0, 0] = 1.0
    A[np.arange(1, T), np.arange(T - 1)] = 1.0
    return A


def test_chain_graph_known_values():
    T = 5
    A = shift_chain(T)
    # reference: column 0 = [1, 1, 0, ...] clips at node 0 -> stuck (S steps);
    # node i in 1..T-2 walks straight to the sink in T-1-i steps.
    for S in (100, 2):
        want = (S + sum(min(T - 1 - i, S) for i in range(1, T - 1))) / T
        assert float(dag.mixing_time(A, max_steps=S)) == pytest.approx(want)
    # normalized: node 0 leaves w.p. 1/2 per step (mean 2), then T-2 more steps.
    want_n = (T + sum(T - 1 - i for i in range(1, T - 1))) / T  # = 2.2
    assert float(dag.mixing_time(A, max_steps=100, chain="normalized")) == pytest.approx(want_n, rel=1e-5)
    # fidelity: sink row of A^t is e_{T-1-t}, then e_0 -> every non-sink node
    # reaches 1 at t = T-1-j; the sink never gets its own signal back.
    np.testing.assert_allclose(dag.node_fidelity(A, horizon=100), [1, 1, 1, 1, 0])
    np.testing.assert_allclose(dag.node_fidelity(A, horizon=2), [0, 0, 1, 1, 0])
    assert float(dag.minimax_fidelity(A, include_sink=True)) == 0.0
    assert float(dag.minimax_fidelity(A, include_sink=False)) == 1.0


# -------------------------------- fidelity ----------------------------------
@pytest.mark.parametrize("seed,T,horizon", [(0, 4, 1), (1, 7, 5), (2, 10, 30)])
def test_node_fidelity_matches_matrix_powers(seed, T, horizon):
    A = random_causal(np.random.default_rng(seed), T)
    want = brute_fidelity(A, horizon)
    np.testing.assert_allclose(dag.node_fidelity(A, horizon=horizon), want, rtol=1e-5, atol=1e-6)
    assert float(dag.minimax_fidelity(A, horizon)) == pytest.approx(want.min(), abs=1e-6)
    assert float(dag.minimax_fidelity(A, horizon, include_sink=False)) == pytest.approx(want[:-1].min(), abs=1e-6)
    # include_sink=True is capped by the sink's self weight
    assert float(dag.minimax_fidelity(A, horizon)) <= A[-1, -1] + 1e-6


def test_batching_equals_per_item():
    rng = np.random.default_rng(3)
    A = np.stack([[random_causal(rng, 6) for _ in range(3)] for _ in range(2)])  # (2, 3, 6, 6)
    fns = {
        "mix": lambda x: dag.mixing_time(x, max_steps=20),
        "mixn": lambda x: dag.mixing_time(x, max_steps=20, chain="normalized"),
        "phi": lambda x: dag.node_fidelity(x, horizon=15),
        "min": lambda x: dag.minimax_fidelity(x, horizon=15, include_sink=False),
    }
    for name, f in fns.items():
        batched = np.asarray(f(A))
        assert batched.shape[:2] == (2, 3), name
        for a in range(2):
            for b in range(3):
                np.testing.assert_allclose(batched[a, b], f(A[a, b]), rtol=1e-6, err_msg=name)


# ------------------------- head weights and synergy --------------------------
def test_head_weights_learned_reads_rows_of_out_kernel():
    D, H = 8, 4
    d = D // H
    K = np.zeros((D, D))
    K[2 * d : 3 * d, :] = np.arange(d * D).reshape(d, D) + 1.0  # only head 2's rows
    np.testing.assert_allclose(dag.head_weights("learned", H, out_kernel=K), [0, 0, 1, 0])
    # the transposed (torch-oriented) kernel spreads over all heads instead
    assert not np.allclose(dag.head_weights("learned", H, out_kernel=K.T), [0, 0, 1, 0])
    # batched over layers, proportional to Frobenius norms
    K2 = np.ones((D, D))
    K2[:d] *= 2.0
    beta = np.asarray(dag.head_weights("learned", H, out_kernel=np.stack([K, K2])))
    assert beta.shape == (2, H)
    np.testing.assert_allclose(beta[1], np.array([2, 1, 1, 1]) / 5, rtol=1e-6)


def test_head_weights_uniform_and_given():
    np.testing.assert_allclose(dag.head_weights("uniform", 4), [0.25] * 4)
    np.testing.assert_allclose(dag.head_weights("given", 3, weights=[1.0, 3.0, 0.0]), [0.25, 0.75, 0.0])
    np.testing.assert_allclose(dag.head_weights("given", 2, weights=[0.0, 0.0]), [0.5, 0.5])
    with pytest.raises(ValueError):
        dag.head_weights("nope", 2)


def test_combine_shapes():
    rng = np.random.default_rng(0)
    attn = np.stack([[random_causal(rng, 5) for _ in range(3)] for _ in range(2)])  # (2, H=3, 5, 5)
    beta = np.array([0.2, 0.3, 0.5])
    out = np.asarray(dag.combine(attn, beta))
    assert out.shape == (2, 5, 5)
    np.testing.assert_allclose(out[1], sum(beta[h] * attn[1, h] for h in range(3)), rtol=1e-6)
    np.testing.assert_allclose(out.sum(-1), 1.0, atol=1e-6)


# -------------------------------- Example 2 ----------------------------------
def test_example2_numbers():
    ops = example2_operators()
    got = {k: float(dag.minimax_fidelity(A, horizon=20, include_sink=False)) for k, A in ops.items()}
    assert got["head1"] == pytest.approx(0.375, abs=1e-4)
    assert got["head2"] == pytest.approx(0.25, abs=1e-4)
    assert got["multi_head"] == pytest.approx(0.41667, abs=1e-4)
    s = dag.synergy(
        np.stack([ops["head1"], ops["head2"]]), dag.head_weights("uniform", 2), horizon=20, include_sink=False
    )
    assert float(s["combined"]) == pytest.approx(5 / 12, abs=1e-5)
    assert float(s["best_single"]) == pytest.approx(0.375, abs=1e-5)
    assert bool(s["combined_beats_best"])
    np.testing.assert_allclose(s["per_head"], [0.375, 0.25], atol=1e-5)


def test_run_example2_writes_outputs(tmp_path):
    r = run_example2(tmp_path)
    assert (tmp_path / "example2.png").stat().st_size > 0
    assert (tmp_path / "example2.json").exists()
    assert r["combined_beats_both"]
    text = format_example2(r)
    assert "37.50%" in text and "25.00%" in text and "41.67%" in text
