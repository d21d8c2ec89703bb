"""The Python API for notebooks: ``mhjax.load_config``, ``mhjax.sweep``, ``mhjax.compile_for``,
``mhjax.load`` (here) and ``Run`` (api/run.py: a workdir read from Python).

What ``mhjax train`` and ``mhjax analyze`` do, as functions: bad input raises
``mhjax.ConfigError`` with the command line's one-line message in Python's words (api/wording.py)
instead of exiting. ``mhjax/__init__.py`` re-exports these names lazily (``import mhjax`` stays fast).
"""

from __future__ import annotations

import os
import sys

import ml_collections

from mhjax.api.run import Run
from mhjax.api.wording import python_errors
from mhjax.experiments import make_experiment
from mhjax.train.status import check_fail
from mhjax.workflows import shards
from mhjax.workflows import target as _target
from mhjax.workflows.configs import load_config as _load_config
from mhjax.workflows.train import train

__all__ = ["Run", "compile_for", "load", "load_config", "sweep"]


@python_errors
def load_config(path_or_name, overrides: dict | None = None) -> ml_collections.ConfigDict:
    """A config file, or a bundled config by name (``"quick"``: configs/quick.py of a checkout;
    an installed package ships no configs), with ``overrides`` {dotted field: value}, e.g.
    ``{"train.steps": 100, "sweep.heads": (1, 4)}``, validated as on the command line."""
    return _load_config(path_or_name, overrides)


@python_errors
def sweep(config, workdir, progress=True, fail_on_divergence=False, allow_changed_task=False, shard=None) -> Run:
    """Train (or resume) every member of ``config`` (a ConfigDict, a path or a bundled name) in
    ``workdir``, as ``mhjax train --config ... --workdir workdir``; returns its Run.
    ``fail_on_divergence``: raise ``mhjax.DivergedError`` when a member diverged, once
    everything is written (``mhjax train --fail-on-divergence``). ``allow_changed_task``: resume
    even if a plug-in's source file changed since the workdir's run (``--allow-changed-task``).
    ``shard``: "I/N", shard I of N only (``--shard I/N``; ``Run.missing_members``, docs/shards.md)."""
    if not isinstance(config, ml_collections.ConfigDict):
        config = load_config(config)
    workdir = os.fspath(workdir)
    log = lambda message: print(message, file=sys.stderr)
    changed = dict(progress=progress, log=log, allow_changed_task=allow_changed_task)
    if shard is not None:  # --shard I/N
        payload = shards.train_shard(make_experiment(config), workdir, *shards.parse(shard), **changed)
    else:
        payload = train(make_experiment(config), workdir, **changed)
    check_fail(payload["members"], fail_on_divergence, "fail_on_divergence=True")
    return load(workdir)


@python_errors
def compile_for(config, target: str = "h200", progress: bool = True):
    """``mhjax train --config ... --dry-run --target target`` as a function: compile every
    executable of ``config``'s sweep (a ConfigDict, a path or a bundled name) for ``target``
    (GPUs: h100, h200, a100, NAMExN or a GpuTargetConfig text file; TPU slices: v5e-4, v5e-8) on
    this machine, nothing run. Returns a report: ``.executables`` (key, seconds,
    arguments/outputs/temp bytes per device, Triton kernels, f32 (T, T) values, bytes per
    member-step) and ``.target`` (its memory_bytes). Needs jax[cuda13] (GPUs) or jax[tpu] (TPU
    slices) at the installed jax version (without it: ConfigError naming the install command);
    on a machine without a GPU, set JAX_PLATFORMS=cpu before JAX starts."""
    if not isinstance(config, ml_collections.ConfigDict):
        config = load_config(config)
    log = (lambda message: print(message, file=sys.stderr)) if progress else (lambda message: None)
    return _target.compile_for(config, target, log=log)


@python_errors
def load(workdir) -> Run:
    """The Run trained in ``workdir`` (no W/mhjax.json: ConfigError). Reading it (results, curves,
    params, analysis, report) needs no task code; its plug-in tasks are registered again, from
    where W/mhjax.json says they came, only when ``run.analyze()`` (or ``run.forward`` without
    targets) needs them (a source that is gone: ConfigError saying how to register it)."""
    return Run(workdir)
