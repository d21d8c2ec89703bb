"""The Python API for notebooks: ``mhjax.load_config``, ``mhjax.sweep``, ``mhjax.load`` and ``Run``.

What ``mhjax train`` and ``mhjax analyze`` do, as functions: bad input raises
``mhjax.ConfigError`` with the command line's one-line message instead of exiting.
``mhjax/__init__.py`` re-exports these names lazily (``import mhjax`` stays fast).
"""

from __future__ import annotations

import os
import sys

import ml_collections

from mhjax.commands.analyze import analyze_workdir
from mhjax.commands.configs import CONFIG_DIR
from mhjax.commands.train import library_logs
from mhjax.config import ConfigError, apply_overrides, load_config_file
from mhjax.data import tasks
from mhjax.experiments import make_experiment, override_defaults
from mhjax.io.lock import WorkdirLock
from mhjax.io.workdir import Workdir
from mhjax.train.loop import run


def load_config(path_or_name, overrides: dict | None = None) -> ml_collections.ConfigDict:
    """A config file, or a bundled config by name (``"quick"``: configs/quick.py of a checkout),
    with ``overrides`` {dotted field: value}, e.g. ``{"train.steps": 100, "sweep.heads": (1, 4)}``,
    validated as on the command line."""
    path = os.fspath(path_or_name)
    if not os.path.isfile(path):
        bundled = os.path.join(CONFIG_DIR, path if path.endswith(".py") else f"{path}.py")
        if os.path.sep not in path and os.path.isfile(bundled):
            path = bundled
    config = load_config_file(path)
    if overrides:
        text = {field: value if isinstance(value, str) else repr(value) for field, value in overrides.items()}
        config = apply_overrides(config, text, override_defaults(config))
    make_experiment(config)  # validates, before anything compiles
    return config


def sweep(config, workdir, progress: bool = True) -> Run:
    """Train (or resume) every member of ``config`` (a ConfigDict, a path or a bundled name) in
    ``workdir``, as ``mhjax train --config ... --workdir workdir``; returns its Run."""
    if not isinstance(config, ml_collections.ConfigDict):
        config = load_config(config)
    experiment = make_experiment(config)
    workdir = Workdir(os.fspath(workdir))
    with WorkdirLock(workdir.path, "train", create=True), library_logs(workdir.log_path):
        run(experiment, workdir, progress=progress, log=lambda message: print(message, file=sys.stderr))
    return load(workdir.path)


def load(workdir) -> Run:
    """The Run trained in ``workdir``; its plug-in tasks are registered again from where
    W/mhjax.json says they came from (a source that is gone: ConfigError naming it)."""
    return Run(workdir)


class Run:
    """A trained (or training) sweep's workdir, read on demand through its Workdir
    (mhjax/io/workdir.py: each file read once while unchanged, again once it changed)."""

    def __init__(self, workdir):
        self.workdir = os.fspath(workdir)
        self._files = Workdir(self.workdir)
        metadata = self._files.metadata()
        self.config = ml_collections.ConfigDict(metadata.get("config", {}))
        tasks.restore(metadata.get("tasks"), self._files.metadata_path)

    def __repr__(self) -> str:
        return f"Run({self.workdir!r})"

    @property
    def results(self) -> list[dict]:
        """One dict per member, as in W/results.json."""
        return self._files.results()["members"]

    @property
    def member_names(self) -> list[str]:
        return self._files.member_names()

    def params(self, name: str):
        """Member ``name``'s parameter tree from its latest checkpoint."""
        return self._files.params(self._member(name))

    def curves(self, name: str) -> dict:
        """{tag: (steps, values)} of member ``name``'s TensorBoard scalars."""
        return self._files.curves(self._member(name))

    def _member(self, name: str) -> str:
        if name not in self.member_names:
            raise ConfigError(f"member: unknown {name!r} (members: {', '.join(self.member_names)})")
        return name

    @property
    def analysis(self) -> dict | None:
        """W/analysis/analysis.json; None until analysed (``run.analyze()``)."""
        return self._files.analysis() if self._files.has_analysis() else None

    def analyze(self, **options) -> dict:
        """``mhjax analyze --workdir W`` with its options as keywords (num_sequences, seed,
        sequences, horizon, max_steps, chain, include_sink, batch_size, tensorboard, plot)."""
        with WorkdirLock(self.workdir, "analyze"):
            result = analyze_workdir(self.workdir, **options)
        return result

    def to_pandas(self):
        """results as a pandas DataFrame, one row per member (pandas is optional)."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("Run.to_pandas needs pandas: pip install pandas") from None
        rows = [{k: v for k, v in m.items() if not isinstance(v, (dict, list))} for m in self.results]
        return pd.DataFrame(rows)
