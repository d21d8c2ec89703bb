"""The paper's Example 2 / Figure 3 (spec §4): two heads whose mix beats both.

Nodes u, v, w, tau (tau = sink = last). Each node has a self-loop, each
directed edge ``src -> tgt`` adds 1 to ``D[tgt, src]`` (row = receiver), and
rows are normalised. Minimax fidelity is taken over t = 1..20 and over the
non-sink nodes u, v, w (expected 0.375, 0.250, 0.4167).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

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
    """``s[t-1, j] = (A^t)[tau, j]`` for t = 1..horizon: shape (horizon, T).

    Tiny fixed example, so float64 numpy is the clearest; the batched JAX
    version lives in :mod:`mhjax.analysis.dag`.
    """
    rows, r = [], A[-1]
    for _ in range(horizon):
        rows.append(r)
        r = r @ A
    return np.stack(rows)


def run_example2(out_dir, horizon: int = HORIZON, plot: bool = True) -> dict:
    """Compute the three minimax fidelities, write ``example2.json`` and ``example2.png``.

    Returns a dict with ``minimax`` (fractions per operator, min over u, v, w),
    ``expected``, ``combined_beats_both`` and the file paths. The values are
    cross-checked against :func:`mhjax.analysis.dag.minimax_fidelity`.
    """
    from mhjax.analysis import dag  # local import: keep module import cheap

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ops = example2_operators()
    signals = {k: sink_signals(A, horizon) for k, A in ops.items()}
    minimax = {k: float(s[:, :-1].max(axis=0).min()) for k, s in signals.items()}
    jax_minimax = {
        k: float(dag.minimax_fidelity(A, horizon=horizon, include_sink=False)) for k, A in ops.items()
    }
    for k in ops:  # the two implementations must agree (float32 vs float64)
        if abs(jax_minimax[k] - minimax[k]) > 1e-5:
            raise AssertionError(f"example2 {k}: numpy {minimax[k]} vs jax {jax_minimax[k]}")

    result = {
        "horizon": horizon,
        "nodes": list(NODES),
        "minimax": minimax,
        "minimax_percent": {k: 100.0 * v for k, v in minimax.items()},
        "expected": EXPECTED,
        "combined_beats_both": minimax["multi_head"] > max(minimax["head1"], minimax["head2"]),
        "operators": {k: A.tolist() for k, A in ops.items()},
        "json": str(out / "example2.json"),
    }
    if plot:
        result["png"] = str(out / "example2.png")
        _plot(signals, out / "example2.png")
    (out / "example2.json").write_text(json.dumps(result, indent=2))
    return result


def _plot(signals: dict[str, np.ndarray], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    titles = {"head1": "Head 1", "head2": "Head 2", "multi_head": "Multi-head (0.5/0.5)"}
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), sharey=True)
    for ax, (name, s) in zip(axes, signals.items()):
        t = np.arange(1, s.shape[0] + 1)
        for j, node in enumerate(NODES[:-1]):
            ax.plot(t, 100 * s[:, j], marker="o", ms=3, label=f"$s_{node}(t)$")
        # running minimax: min over nodes of the best signal seen so far
        running = 100 * np.maximum.accumulate(s[:, :-1], axis=0).min(axis=1)
        ax.plot(t, running, "k--", label=r"running $\phi_{\min}$")
        ax.set_title(f"{titles[name]}: $\\phi_{{\\min}}$ = {running[-1]:.1f}%")
        ax.set_xlabel("steps t")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("% of signal at sink")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def format_example2(result: dict) -> str:
    """Human-readable summary of :func:`run_example2`'s result."""
    m, e = result["minimax"], result["expected"]
    lines = [f"Example 2 minimax fidelity over t=1..{result['horizon']} (min over u, v, w):"]
    for k, label in (("head1", "head 1"), ("head2", "head 2"), ("multi_head", "multi-head")):
        lines.append(f"  {label:<10} {100 * m[k]:7.2f}%  (paper {100 * e[k]:.2f}%)")
    lines.append(f"  combined beats both heads: {result['combined_beats_both']}")
    return "\n".join(lines)
