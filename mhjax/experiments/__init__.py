"""Experiments: each turns a config into sweep members and per-program recipes."""

from __future__ import annotations

from mhjax.config import ConfigError


def experiment_class(kind):
    """The Experiment class of ``kind`` (the config's ``experiment`` field)."""
    if kind == "sequence":
        from mhjax.experiments.sequence import SequenceExperiment

        return SequenceExperiment
    if kind == "mixture":
        from mhjax.experiments.mixture import MixtureExperiment

        return MixtureExperiment
    raise ConfigError(f"config.experiment: must be one of sequence, mixture; got {kind!r}")


def make_experiment(config):
    return experiment_class(config.get("experiment", "sequence"))(config)


def override_defaults(config) -> dict:
    """{dotted field: default} of the fields ``config``'s experiment knows beyond those the file
    sets: what ``--config.FIELD=VALUE`` may set although the file leaves it out."""
    if config.get("experiment", "sequence") == "mixture":
        from mhjax.experiments.mixture_config import DEFAULTS

        return dict(DEFAULTS)
    from mhjax.experiments.sequence_config import DEFAULTS

    return dict(DEFAULTS)
