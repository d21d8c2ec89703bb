"""The TensorBoard tags of ``mhjax analyze --workdir W``, named once: the analyze workflow logs
them to each member's run, the sequence experiment lists them as HParams metrics."""

from __future__ import annotations

ACCURACY, ACCURACY_EXCLUDING_FIRST = "analysis/accuracy", "analysis/accuracy_excluding_first"
LOSS, ROLLOUT_MIN = "analysis/loss", "analysis/rollout_min"
ROLLOUT_SINK_ROW = "analysis/rollout/sink_row"  # an image
# per layer, from the DAG metrics: {analysis.json key: tag name}
LAYER_METRICS = {
    "mixing_time_mean": "mixing_time",
    "mixing_time_std": "mixing_time_std",
    "fidelity_pct_mean": "fidelity_pct",
    "fidelity_pct_std": "fidelity_pct_std",
    "best_single_fidelity_pct_mean": "best_single_fidelity_pct",
    "combined_beats_best_share": "combined_beats_best_share",
}
# per layer, from head ablation and rollout (under their analysis.json key), when computed
LAYER_HEAD_METRICS = ("rollout_min", "rollout_fidelity_spearman", "accuracy_synergy")
# per layer and head, from head ablation (analysis.json's ablation lists): over the steps analysed,
# the curves of steps_head_importance.png for every member
HEAD_ABLATION_METRICS = ("loss_without", "accuracy_without")
# the per-layer tags listed as HParams metrics
HPARAMS_LAYER_METRICS = ("mixing_time", "fidelity_pct", "accuracy_synergy", "rollout_min")


def layer_tag(layer: int, name: str) -> str:
    """``analysis/layer{layer}/{name}``."""
    return f"analysis/layer{layer}/{name}"


def head_tag(layer: int, head: int, name: str) -> str:
    """``analysis/layer{layer}/head{head}/{name}``: a head's ablation value (HEAD_ABLATION_METRICS)."""
    return f"analysis/layer{layer}/head{head}/{name}"


def attention_tag(layer: int) -> str:
    """The heatmap of every head and the combined operator of ``layer``."""
    return f"analysis/attention/layer{layer}"


def hparams_metrics(num_layers: int) -> list[str]:
    """The tags the HParams dashboard lists as metrics of a sequence sweep (filled by analyze)."""
    tags = [ACCURACY, LOSS, ROLLOUT_MIN]
    for layer in range(num_layers):
        tags += [layer_tag(layer, name) for name in HPARAMS_LAYER_METRICS]
    return tags
