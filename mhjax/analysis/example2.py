"""Example 2 / Figure 3 of "Beyond Parallelism" (arXiv 2507.02944): two heads whose mix beats both.

Nodes u, v, w, tau (tau = sink = last). Each node has a self-loop, each
directed edge ``src -> tgt`` adds 1 to ``D[tgt, src]`` (row = receiver), and
rows are normalised. Minimax fidelity is taken over t = 1..20 and over the
non-sink nodes u, v, w (expected 0.375, 0.250, 0.4167).
"""

from __future__ import annotations

import numpy as np

from mhjax.analysis import dag

NODES = ("u", "v", "w", "tau")
HEAD1_EDGES = (("u", "v"), ("v", "w"), ("w", "tau"))
HEAD2_EDGES = (("u", "w"), ("v", "w"), ("v", "tau"), ("w", "tau"))
HORIZON = 20
EXPECTED = {"head1": 0.375, "head2": 0.25, "multi_head": 5.0 / 12.0}


def build_operator(edges) -> np.ndarray:
    """Row-normalised (4, 4) operator with self-loops; ``D[tgt, src] += 1`` per edge."""
    idx = {n: i for i, n in enumerate(NODES)}
    D = np.eye(len(NODES))
    for src, tgt in edges:
        D[idx[tgt], idx[src]] += 1.0
    return D / D.sum(axis=1, keepdims=True)


def example2_operators() -> dict[str, np.ndarray]:
    """``{"head1", "head2", "multi_head"}`` -> (4, 4) operators (multi = 0.5 D1 + 0.5 D2)."""
    d1, d2 = build_operator(HEAD1_EDGES), build_operator(HEAD2_EDGES)
    return {"head1": d1, "head2": d2, "multi_head": 0.5 * d1 + 0.5 * d2}


def sink_signals(A: np.ndarray, horizon: int = HORIZON) -> np.ndarray:
    """``s[t-1, j] = (A^t)[tau, j]`` for t = 1..horizon: shape (horizon, T), float64."""
    return dag.sink_signals_float64(A, horizon)


def example2(horizon: int = HORIZON) -> dict:
    """The three operators, their sink signals (float64) and minimax fidelities (min over u,
    v, w): ``{"operators", "signals", "minimax", "combined_beats_both"}``."""
    ops = example2_operators()
    signals = {k: sink_signals(A, horizon) for k, A in ops.items()}
    minimax = {k: float(s[:, :-1].max(axis=0).min()) for k, s in signals.items()}
    return {
        "operators": ops,
        "signals": signals,
        "minimax": minimax,
        "combined_beats_both": minimax["multi_head"] > max(minimax["head1"], minimax["head2"]),
    }
