"""Analysis in jax.numpy: attention heads as DAGs (arXiv 2507.02944) and NTK quantities (arXiv 2310.12680)."""

from mhjax.analysis.dag import (
    combine,
    head_weights,
    minimax_fidelity,
    mixing_time,
    mixing_time_mc,
    node_fidelity,
    synergy,
    transition_matrix,
)

__all__ = [
    "combine",
    "head_weights",
    "minimax_fidelity",
    "mixing_time",
    "mixing_time_mc",
    "node_fidelity",
    "synergy",
    "transition_matrix",
]
