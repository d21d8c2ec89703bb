"""A trained sweep's members from Python (``mhjax.load(W)``'s Run): parameters at a kept step,
and what an experiment offers of a member (mixture: its data, theta_0, model, NTK and an
analysis at given steps; Experiment's ``seed_data``, ``theta0``, ``model``, ``ntk``,
``analyze_states``, each a one-line ConfigError where an experiment has none).

Parameters and the kept steps are read without plug-in code; anything rebuilt (data, theta_0,
the model) makes the experiment from the run's config with its plug-ins restored first
(workflows/workdir.py), so it is the run's own, in a new process too.
"""

from __future__ import annotations

import sys
import warnings

import numpy as np

from mhjax.config import ConfigError
from mhjax.io import trace as traces
from mhjax.plotting.ntk_steps import plot_margin_steps
from mhjax.workflows.workdir import Opened


def member(opened: Opened, name: str) -> str:
    names = opened.files.member_names()
    if name not in names:
        raise ConfigError(f"member: unknown {name!r} (members: {', '.join(names)})")
    return name


def kept_steps(opened: Opened) -> list[int]:
    """The steps whose parameters are kept: the checkpoints' and the snapshots', ascending."""
    return sorted(set(opened.files.checkpoint_steps()) | set(opened.files.snapshot_steps()))


def check_step(opened: Opened, step: int) -> int:
    """``step`` when a checkpoint or a snapshot holds it, else a one-line ConfigError listing the kept steps."""
    kept = kept_steps(opened)
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or int(step) not in kept:
        listed = ", ".join(map(str, kept)) or "none"
        raise ConfigError(f"step: no checkpoint or snapshot at step {step} in {opened.path} (kept: {listed})")
    return int(step)


def raw_params(opened: Opened, name: str, step: int | None = None):
    """Member ``name``'s parameter tree as kept at ``step`` (None: the latest checkpoint; else a
    kept checkpoint or a snapshot, train/snapshots.py); a step without either is a one-line
    ConfigError listing the kept ones."""
    name = member(opened, name)
    return opened.files.params(name, None if step is None else check_step(opened, step))


def params(opened: Opened, name: str, step: int | None = None):
    """``raw_params`` as a user sees them (Experiment.stored_params: a mixture member's cut to
    its own head count); needs no plug-in code."""
    record = next(m for m in opened.files.results()["members"] if m["name"] == member(opened, name))
    return opened.kind.stored_params(record, raw_params(opened, name, step))


def data(opened: Opened, seed: int):
    return opened.experiment().seed_data(seed)


def theta0(opened: Opened, name: str):
    return opened.experiment().theta0(member(opened, name))


def model(opened: Opened, name: str):
    record = next(m for m in opened.files.results()["members"] if m["name"] == member(opened, name))
    apply = opened.kind.record_model(record, opened.files.config())
    return apply if apply is not None else opened.experiment().model(name)


def ntk(opened: Opened, name: str, step: int = 0):
    """Member ``name``'s NTK record at ``step`` (0: theta_0, rebuilt; else a kept checkpoint)."""
    padded = None if step == 0 else raw_params(opened, name, step)
    return opened.experiment().ntk(member(opened, name), padded, step)


def analyze_steps(opened: Opened, steps=None, log=None) -> list[dict]:
    """Every member at ``steps`` (0, kept checkpoints and snapshots; "all": 0, the snapshots and the latest;
    None: 0 and the latest), one record per (member, step) (Experiment.analyze_states). With more
    than one step, W/ntk_margin_steps.png draws the NTK margin against them, one line per head count.
    ``log`` (default: stderr): the number of (member, step) pairs, an estimate of the time, progress."""
    log = log or (lambda message: print(message, file=sys.stderr))
    latest = opened.files.latest_step()
    if steps == "all":  # step 0, the snapshots and the latest checkpoint
        steps = [0, *opened.files.snapshot_steps(), *([latest] if latest is not None else [])]
    wanted = sorted({0, *([latest] if latest is not None else [])} if steps is None else set(steps))
    names = opened.files.member_names()
    states = {step: {n: None if step == 0 else raw_params(opened, n, step) for n in names} for step in wanted}
    records = opened.experiment().analyze_states(states, log)
    members = opened.files.results()["members"]
    try:  # W/ntk_margin_steps.png, which the report shows with the experiment's figures
        plot_margin_steps(records, members, opened.files.sweep_fields(), opened.files.file(MARGIN_FIGURE))
    except Exception as exc:  # noqa: BLE001 -- a figure never costs the records
        warnings.warn(f"analyze: {MARGIN_FIGURE} not drawn ({type(exc).__name__}: {exc})", stacklevel=3)
    return records


MARGIN_FIGURE = "ntk_margin_steps.png"  # the NTK margin against the steps analysed, one line per H


def trace(opened: Opened, name: str) -> traces.Trace:
    """Member ``name``'s per-step trace (W/trace, io/trace.py): {"step": ..., field: ...} numpy arrays, keys as
    attributes too (``trace.loss``)."""
    return traces.read(opened.files.trace_dir, member(opened, name))
