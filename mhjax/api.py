"""The Python API for notebooks: ``mhjax.load_config``, ``mhjax.sweep``, ``mhjax.load`` and ``Run``.

What ``mhjax train`` and ``mhjax analyze`` do, as functions: bad input raises
``mhjax.ConfigError`` with the command line's one-line message instead of exiting.
``mhjax/__init__.py`` re-exports these names lazily (``import mhjax`` stays fast).
"""

from __future__ import annotations

import os
import sys

import ml_collections

from mhjax.commands.analyze import _workdir_sweep, analyze_workdir
from mhjax.commands.configs import CONFIG_DIR
from mhjax.commands.train import library_logs
from mhjax.config import ConfigError, apply_overrides, load_config_file
from mhjax.data import tasks
from mhjax.experiments import make_experiment
from mhjax.io.lock import WorkdirLock
from mhjax.io.results import load_analysis, read_workdir_json
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
        config = apply_overrides(config, text)
    make_experiment(config)  # validates, before anything compiles
    return config


def sweep(config, workdir, progress: bool = True) -> Run:
    """Train (or resume) every member of ``config`` (a ConfigDict, a path or a bundled name) in
    ``workdir``, as ``mhjax train --config ... --workdir workdir``; returns its Run."""
    if not isinstance(config, ml_collections.ConfigDict):
        config = load_config(config)
    experiment = make_experiment(config)
    workdir = os.fspath(workdir)
    with WorkdirLock(workdir, "train", create=True), library_logs(os.path.join(workdir, "mhjax.log")):
        run(experiment, workdir, progress=progress, log=lambda message: print(message, file=sys.stderr))
    return load(workdir)


def load(workdir) -> Run:
    """The Run trained in ``workdir``; its plug-in tasks are registered again from where
    W/mhjax.json says they came from (a source that is gone: ConfigError naming it)."""
    return Run(workdir)


class _Reads:
    """Every read of a workdir that Run makes, in one place (the Workdir reader of the resume
    issue will replace these bodies one for one)."""

    def __init__(self, path: str):
        self.path = path

    def metadata(self) -> dict:
        return read_workdir_json(self.path, "mhjax.json", "not a mhjax sweep workdir")

    def results(self) -> dict:
        return read_workdir_json(self.path, "results.json", f"train it first (mhjax.sweep(config, {self.path!r}))")

    def analysis(self) -> dict | None:
        return load_analysis(self.path)

    def curves(self, member: str) -> dict:
        import numpy as np
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # slow: only here

        run_dir = os.path.join(self.path, "tb", member)
        if not os.path.isdir(run_dir):
            raise ConfigError(f"--workdir: {self.path} has no TensorBoard run {run_dir}")
        events = EventAccumulator(run_dir, size_guidance={"scalars": 0, "images": 1, "tensors": 1, "histograms": 1})
        events.Reload()
        out = {}
        for tag in sorted(events.Tags().get("scalars", [])):
            by_step = {e.step: e.value for e in events.Scalars(tag)}  # a resumed run: the last value wins
            steps = sorted(by_step)
            out[tag] = (np.array(steps), np.array([by_step[s] for s in steps], float))
        return out

    def member_params(self) -> dict:
        """{member name: params} of the latest checkpoint."""
        _, sweep_, _, states = _workdir_sweep(self.path)
        return {name: state.params for name, state in sweep_.member_states(states).items()}


class Run:
    """A trained (or training) sweep's workdir, read on demand."""

    def __init__(self, workdir):
        self.workdir = os.fspath(workdir)
        self._reads = _Reads(self.workdir)
        metadata = self._reads.metadata()
        self.config = ml_collections.ConfigDict(metadata.get("config", {}))
        tasks.restore(metadata.get("tasks"), os.path.join(self.workdir, "mhjax.json"))
        self._params = None

    def __repr__(self) -> str:
        return f"Run({self.workdir!r})"

    @property
    def results(self) -> list[dict]:
        """One dict per member, as in W/results.json."""
        members = self._reads.results().get("members")
        if not isinstance(members, list):
            raise ConfigError(f"--workdir: {os.path.join(self.workdir, 'results.json')} has no member list")
        return members

    @property
    def member_names(self) -> list[str]:
        return [m["name"] for m in self.results]

    def params(self, name: str):
        """Member ``name``'s parameter tree from its latest checkpoint."""
        if self._params is None:
            self._params = self._reads.member_params()
        if name not in self._params:
            raise ConfigError(f"member: unknown {name!r} (members: {', '.join(self._params)})")
        return self._params[name]

    def curves(self, name: str) -> dict:
        """{tag: (steps, values)} of member ``name``'s TensorBoard scalars."""
        if name not in self.member_names:
            raise ConfigError(f"member: unknown {name!r} (members: {', '.join(self.member_names)})")
        return self._reads.curves(name)

    @property
    def analysis(self) -> dict | None:
        """W/analysis/analysis.json; None until analysed (``run.analyze()``)."""
        return self._reads.analysis()

    def analyze(self, **options) -> dict:
        """``mhjax analyze --workdir W`` with its options as keywords (num_sequences, seed,
        sequences, horizon, max_steps, chain, include_sink, batch_size, tensorboard, plot)."""
        with WorkdirLock(self.workdir, "analyze"):
            return analyze_workdir(self.workdir, **options)

    def to_pandas(self):
        """results as a pandas DataFrame, one row per member (pandas is optional)."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("Run.to_pandas needs pandas: pip install pandas") from None
        rows = [{k: v for k, v in m.items() if not isinstance(v, (dict, list))} for m in self.results]
        return pd.DataFrame(rows)
