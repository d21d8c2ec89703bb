"""Experiments: each turns a config into sweep members and per-program recipes."""

from __future__ import annotations

from mhjax.config import ConfigError


def make_experiment(config):
    kind = config.get("experiment", "sequence")
    if kind == "sequence":
        from mhjax.experiments.sequence import SequenceExperiment

        return SequenceExperiment(config)
    if kind == "mixture":
        from mhjax.experiments.mixture import MixtureExperiment

        return MixtureExperiment(config)
    raise ConfigError(f"config.experiment: must be one of sequence, mixture; got {kind!r}")
