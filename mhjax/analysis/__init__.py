"""DAG / signal-diffusion analysis of attention heads (spec §1-4)."""

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
