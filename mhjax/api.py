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
from mhjax.experiments import experiment_class, make_experiment, override_defaults
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
        self._kind = experiment_class(metadata.get("experiment", self.config.get("experiment", "sequence")))
        self._kind.restore_plugins(metadata, self._files.metadata_path)
        self._experiment = None

    def __repr__(self) -> str:
        return f"Run({self.workdir!r})"

    @property
    def results(self) -> list[dict]:
        """One dict per member, as in W/results.json."""
        return self._files.results()["members"]

    @property
    def member_names(self) -> list[str]:
        return self._files.member_names()

    @property
    def experiment(self):
        """The sweep's Experiment, made once from the run's config (its plug-ins restored)."""
        if self._experiment is None:
            self._experiment = make_experiment(self.config)
        return self._experiment

    @property
    def checkpoint_steps(self) -> list[int]:
        """The steps of the kept checkpoints, ascending."""
        return self._files.checkpoint_steps()

    def _raw_params(self, name: str, step: int | None):
        name = self._member(name)
        if step is not None and step not in self.checkpoint_steps:
            kept = ", ".join(map(str, self.checkpoint_steps)) or "none"
            raise ConfigError(f"step: no checkpoint at step {step} in {self.workdir} (kept: {kept})")
        return self._files.params(name, step)

    def _record(self, name: str) -> dict:
        return next(m for m in self.results if m["name"] == self._member(name))

    def params(self, name: str, step: int | None = None):
        """Member ``name``'s parameter tree at checkpoint ``step`` (default: the latest; another
        step needs a kept checkpoint, ``checkpoint_steps``). A mixture member's come cut to its
        own head count."""
        return self._kind.stored_params(self._record(name), self._raw_params(name, step))

    def data(self, seed: int):
        """(mixture) The seed's data as the run drew it: ``x_train, y_train`` (its largest n) and
        ``x_test, y_test``."""
        return self.experiment.seed_data(seed)

    def theta0(self, name: str):
        """(mixture) theta_0 of member ``name``, as training drew it (unpadded)."""
        return self.experiment.theta0(self._member(name))

    def model(self, name: str):
        """A pure ``apply(params, X)`` of member ``name``'s model (mixture: (N, T, d) -> (N,) at its
        own head count; params as ``params`` and ``theta0`` return them)."""
        return self.experiment.model(self._member(name))

    def ntk(self, name: str, step: int = 0):
        """(mixture) The NTK record of member ``name`` at ``step`` (0: theta_0, else a kept
        checkpoint): ``gram`` (n x n, its own n examples), ``margin`` (results.json's ntk_margin
        at step 0), ``gap``, ``radius``."""
        padded = None if step == 0 else self._raw_params(name, step)
        return self.experiment.ntk(self._member(name), padded, step)

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

    def analyze(self, steps=None, **options):
        """Sequence sweeps: ``mhjax analyze --workdir W`` with its options as keywords
        (num_sequences, seed, sequences, horizon, max_steps, chain, include_sink, batch_size,
        tensorboard, plot); returns the analysis dict.

        Mixture sweeps: margins and Hessian quantities at ``steps`` (0 and kept checkpoints;
        default: 0 and the latest). Returns a list of records, one per (member, step):
        member, step, ntk_margin, ntk_margin_gap, ntk_radius and the evaluation's fields
        (train_loss_eval, test_loss, test_accuracy, train_accuracy, hessian_min, hessian_max,
        step_times_hessian_max, distance_from_init; grad_norm_over_loss and
        min_hessian_eig_over_loss_sqrtH for a loss with an exponential tail)."""
        if self._kind.analyzes_states:
            if options:
                raise ConfigError(f"analyze: a mixture sweep takes only steps=, got {', '.join(options)}")
            latest = self._files.latest_step()
            wanted = sorted({0, *([latest] if latest is not None else [])} if steps is None else set(steps))
            states = {}
            for step in wanted:
                states[step] = {n: None if step == 0 else self._raw_params(n, step) for n in self.member_names}
            return self.experiment.analyze_states(states)
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
