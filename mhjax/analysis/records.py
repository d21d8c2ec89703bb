"""The analysis's settings and results as types: :class:`AnalysisOptions` in, one
:class:`MemberAnalysis` (a typed dict: analysis.json's member entry, keys unchanged) out."""

from __future__ import annotations

import dataclasses
from typing import Any, TypedDict

import numpy as np


@dataclasses.dataclass(frozen=True, kw_only=True)
class AnalysisOptions:
    """How :func:`mhjax.analysis.metrics.analyze_params` measures (the reference conventions by
    default) and batches; ``keep_attention`` also returns sequence 0's maps, ``ablate`` the heads'."""

    horizon: int = 100
    max_steps: int = 100
    include_sink: bool = True
    chain: str = "reference"
    batch_size: int = 50
    keep_attention: bool = False
    block: int = 8
    ablate: bool = True


class LayerAnalysis(TypedDict, total=False):
    layer: int
    mixing_time_mean: float
    mixing_time_std: float
    fidelity_pct_mean: float
    fidelity_pct_std: float
    best_single_fidelity_pct_mean: float
    best_single_fidelity_pct_std: float
    combined_beats_best_share: float
    head_weights: list[float]
    rollout_min: float
    rollout_min_mean_heads: float
    rollout_fidelity_spearman: float | None
    ablation: dict[str, list[float]]  # with ablate
    accuracy_synergy: float  # with ablate
    head_weight_ablation_spearman: float | None  # with ablate


class MemberAnalysis(TypedDict, total=False):
    heads: int
    task: str
    num_sequences: int
    seq_len: int
    loss: float
    accuracy: float
    accuracy_excluding_first: float
    rollout_min: float
    rollout_min_mean_heads: float
    conventions: dict[str, Any]
    model: dict[str, int]
    layers: list[LayerAnalysis]
    attention: np.ndarray  # with keep_attention: (L, H, T, T) of sequence 0, not JSON
    combined: np.ndarray  # with keep_attention: (L, T, T)
    rollout_sink_row: np.ndarray  # with keep_attention: (L, T), mean over sequences
