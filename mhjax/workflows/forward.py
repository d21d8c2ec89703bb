"""A trained member run on given tokens (``Run.forward``; its model as a pure function is
``Run.model``, Experiment.record_model): read from a workdir with no task code, except for the targets a task makes from
tokens (copy, cycle, zero, ...), registered again from where W/mhjax.json says it came."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np

from mhjax.analysis.forward import Forward, forward
from mhjax.config import ConfigError
from mhjax.data import tasks
from mhjax.models import probe
from mhjax.workflows.members import check_step
from mhjax.workflows.workdir import open_workdir


def member_record(opened, member: str) -> dict:
    """``member``'s entry of the workdir's results (its heads, task and task parameters)."""
    members = opened.files.results()["members"]
    for record in members:
        if record.get("name") == member:
            if "heads" not in record:
                raise ConfigError(f"member: {member!r} is not a Transformer member (its results record no heads)")
            return record
    raise ConfigError(f"member: unknown {member!r} (members: {', '.join(m.get('name', '?') for m in members)})")


def check_changed_task(opened, record: dict, allow_changed_task: bool = False) -> dict | None:
    """The member's task source's sha256 {"recorded", "current"} (None: nothing recorded); a
    source or data file (the text task's corpus) changed since training is a ConfigError unless
    ``allow_changed_task``, as in analyze, whether the targets are the task's or given."""
    name = record.get("task")
    source = opened.recorded_tasks().get(name)
    changed = tasks.changed_sources({name: source}) if source else []
    if changed and not allow_changed_task:
        raise tasks.changed_error(changed, opened.interface)
    return tasks.source_hashes(source) or None if source else None


def task_targets(opened, record: dict, tokens):
    """(the member's task's targets for ``tokens``, their weights: the task's where its
    ``targets(tokens)`` gives them, else every position 1); its source is checked first
    (check_changed_task). (None, None) when the task has no ``targets(tokens)`` form, or,
    with a UserWarning saying why, when it cannot be registered again (its source gone, or
    defined in __main__): the loss fields of the Forward are then None; pass targets."""
    name = record.get("task")
    try:
        opened.restore_tasks(only=name)
        task = tasks.get_task(name).with_params(record.get("task_params"))
    except ConfigError as exc:
        warnings.warn(f"forward: no targets from task {name!r}, so no loss: {exc}", UserWarning, stacklevel=4)
        return None, None
    if task.targets is None:
        return None, None
    targets, weights = task.targets_and_weights(np.asarray(tokens, np.int32))
    return np.asarray(targets), np.asarray(weights, np.float32)


def member_forward(
    workdir,
    member: str,
    tokens,
    targets=None,
    weights=None,
    heads_off=None,
    allow_changed_task: bool = False,
    patch=None,
    patch_tokens=None,
    patch_positions=None,
    step: int | None = None,
) -> Forward:
    """:func:`mhjax.analysis.forward.forward` of ``member`` at the workdir's latest checkpoint, or
    at ``step`` (a kept checkpoint or a snapshot: workflows/members.check_step).
    A task source or corpus changed since training is refused unless ``allow_changed_task``
    (check_changed_task), given targets or not; the Forward says whether it was given and the
    source's recorded and current sha256. Without ``targets``: its task's ``targets(tokens)`` and
    their weights when the task makes them (see :func:`task_targets`), else no loss. ``patch``, ``patch_tokens``,
    ``patch_positions``: activation patching (the forward's); the targets stay the clean tokens'."""
    opened = open_workdir(workdir)
    record = member_record(opened, member)
    step = None if step is None else check_step(opened, step)  # before any task code runs
    hashes = check_changed_task(opened, record, allow_changed_task)  # given targets or the task's
    tokens = np.asarray(tokens)
    stated = {} if hashes is None else dict(allow_changed_task=bool(allow_changed_task), task_sha256=hashes)
    if targets is None:
        if weights is not None:
            raise ConfigError("weights: given without targets; pass targets too")
        if tokens.ndim in (1, 2) and tokens.size and np.issubdtype(tokens.dtype, np.integer):
            targets, weights = task_targets(opened, record, tokens if tokens.ndim == 2 else tokens[None])
            stated = dict(allow_changed_task=bool(allow_changed_task), task_sha256=hashes)
    params = opened.files.params(member, step)
    sizes = probe.model_sizes(params)  # the member's own sizes (a swept width or head size included)
    result = forward(
        params, record["heads"], sizes, tokens, targets, weights, heads_off, patch, patch_tokens, patch_positions
    )
    return dataclasses.replace(result, **stated)
