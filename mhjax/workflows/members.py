"""A trained sweep's members from Python (``mhjax.load(W)``'s Run): parameters at a kept step,
and what an experiment offers of a member (mixture: its data, theta_0, model, NTK and an
analysis at given steps; Experiment's ``seed_data``, ``theta0``, ``model``, ``ntk``,
``analyze_states``, each a one-line ConfigError where an experiment has none).

Parameters and the kept steps are read without plug-in code; anything rebuilt (data, theta_0,
the model) makes the experiment from the run's config with its plug-ins restored first
(workflows/workdir.py), so it is the run's own, in a new process too.
"""

from __future__ import annotations

from mhjax.config import ConfigError
from mhjax.io import trace as traces
from mhjax.workflows.workdir import Opened


def member(opened: Opened, name: str) -> str:
    names = opened.files.member_names()
    if name not in names:
        raise ConfigError(f"member: unknown {name!r} (members: {', '.join(names)})")
    return name


def raw_params(opened: Opened, name: str, step: int | None = None):
    """Member ``name``'s parameter tree as checkpointed at ``step`` (None: the latest); a step
    without a kept checkpoint is a one-line ConfigError listing the kept ones."""
    name = member(opened, name)
    if step is not None:
        kept = opened.files.checkpoint_steps()
        if step not in kept:
            listed = ", ".join(map(str, kept)) or "none"
            raise ConfigError(f"step: no checkpoint at step {step} in {opened.path} (kept: {listed})")
    return opened.files.params(name, step)


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


def analyze_steps(opened: Opened, steps=None) -> list[dict]:
    """Every member at ``steps`` (0 and kept checkpoints; None: 0 and the latest), one record per
    (member, step) (Experiment.analyze_states)."""
    latest = opened.files.latest_step()
    wanted = sorted({0, *([latest] if latest is not None else [])} if steps is None else set(steps))
    names = opened.files.member_names()
    states = {step: {n: None if step == 0 else raw_params(opened, n, step) for n in names} for step in wanted}
    return opened.experiment().analyze_states(states)


def trace(opened: Opened, name: str) -> dict:
    """Member ``name``'s per-step trace (W/trace, io/trace.py): {"step": ..., field: ...} numpy arrays."""
    return traces.read(opened.files.trace_dir, member(opened, name))
