"""Opening a trained (or training) sweep's workdir, for analyze, report and the Python API.

Reading its metadata, results, curves and parameters needs no task code (mhjax/io/workdir.py
reads them); the plug-ins it was trained with (tasks; a mixture sweep's data, phi, loss and step
rule) are registered again, and its experiment made, only when something asks for them
(analyze: the model and the tasks' samplers; a mixture run's data, theta_0 and NTK)."""

from __future__ import annotations

import ml_collections

from mhjax.config import ConfigError
from mhjax.data import plugins, tasks
from mhjax.experiments import experiment_class, make_experiment
from mhjax.io.workdir import Workdir
from mhjax.workflows import growth


class Opened:
    """A workdir's files (``files``, a Workdir: each read once while unchanged) and, on demand,
    its config, its tasks and its experiment. Reads nothing until asked."""

    def __init__(self, workdir, interface: str = "cli"):
        self.files = Workdir.of(workdir)
        self.interface = interface  # whose words messages use: "cli" (flags) or "python" (arguments)
        self._experiment = None

    @property
    def path(self) -> str:
        return self.files.path

    def __repr__(self) -> str:
        return f"Opened({self.path!r})"

    @property
    def config(self) -> ml_collections.ConfigDict:
        """The config the sweep was trained with (W/mhjax.json)."""
        try:
            return ml_collections.ConfigDict(self.files.config())
        except (TypeError, AttributeError) as exc:
            raise ConfigError(f"--workdir: {self.files.metadata_path} is unreadable ({type(exc).__name__})") from None

    @property
    def kind(self):
        """The sweep's Experiment class (W/mhjax.json's experiment), not made: no plug-in code runs."""
        metadata = self.files.metadata()
        return experiment_class(metadata.get("experiment") or self.config.get("experiment", "sequence"))

    def recorded_tasks(self) -> dict:
        """{task: its source as W/mhjax.json records it}."""
        return self.files.metadata().get("tasks") or {}

    def restore_tasks(self, allow_changed: bool | None = None, only: str | None = None) -> None:
        """Register again the plug-in tasks W/mhjax.json says the sweep used (``only``: that one),
        from where they came (a source that is gone: a one-line ConfigError naming it and how to
        register it); ``allow_changed=False``: a source file changed since training is a
        ConfigError too."""
        recorded = self.recorded_tasks()
        if only is not None:
            recorded = {only: recorded[only]} if only in recorded else {}
        tasks.restore(recorded, self.files.metadata_path, allow_changed, self.interface)

    def restore_plugins(self) -> None:
        """Register again the plug-ins W/mhjax.json says the sweep used (its tasks; a mixture
        sweep's data generator, phi, loss and step rule), from where they came (a source that is
        gone: a one-line ConfigError naming it). A plug-in other than a task (whose check is
        ``restore_tasks``'s caller's to ask for) whose source file changed since training is
        refused before it runs: the data, theta_0 and NTK rebuilt would not be the run's."""
        self.restore_tasks()
        metadata = self.files.metadata()
        changed = plugins.changed_sources({k: v for k, v in metadata.items() if k != "tasks"})
        if changed:
            raise ConfigError(f"{changed[0]}; what is rebuilt from it would not be the run's: put it back as it was")
        self.kind.restore_plugins(metadata, self.files.metadata_path)

    def experiment(self):
        """The sweep's Experiment, made once (its plug-ins restored first)."""
        if self._experiment is None:
            config = self.config
            self.restore_plugins()
            experiment = make_experiment(config)
            experiment.keep_names(self.files.recorded_names())  # the names its run gave its members
            growth.adopt_names(experiment, self.files.metadata())  # and those of a sweep that grew
            self._experiment = experiment
        return self._experiment


def open_workdir(workdir, interface: str = "cli") -> Opened:
    """``workdir`` (a path, a Workdir or an Opened) opened; nothing is read yet. ``interface``:
    whose words its messages use, "cli" (a command's flags) or "python" (mhjax.load's Run)."""
    return workdir if isinstance(workdir, Opened) else Opened(workdir, interface)
