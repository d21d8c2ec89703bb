"""A trained member run on given tokens (``Run.forward``; its model as a pure function is
``Run.model``, Experiment.record_model): read from a workdir with no task code, except for the targets a task makes from
tokens (copy, cycle, zero, ...), registered again from where W/mhjax.json says it came."""

from __future__ import annotations

import numpy as np

from mhjax.analysis.forward import Forward, forward, model_sizes
from mhjax.config import ConfigError
from mhjax.data import tasks
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


def task_targets(opened, record: dict, tokens):
    """The member's task's targets for ``tokens`` (every position then weighted), or None when
    the task has no ``targets(tokens)`` form or cannot be registered again (its source gone or
    in __main__: the loss fields of the Forward are then None; pass targets)."""
    name = record.get("task")
    if name not in tasks.registered():
        try:
            opened.restore_tasks()
        except ConfigError:
            return None
    if name not in tasks.registered():
        return None
    task = tasks.get_task(name).with_params(record.get("task_params"))
    return None if task.targets is None else np.asarray(task.call_targets(np.asarray(tokens, np.int32)))


def member_forward(workdir, member: str, tokens, targets=None, weights=None, heads_off=None) -> Forward:
    """:func:`mhjax.analysis.forward.forward` of ``member`` at the workdir's latest checkpoint.
    Without ``targets``: its task's ``targets(tokens)`` when the task makes them (see
    :func:`task_targets`), else no loss."""
    opened = open_workdir(workdir)
    record = member_record(opened, member)
    tokens = np.asarray(tokens)
    if targets is None:
        if weights is not None:
            raise ConfigError("weights: given without targets; pass targets too")
        if tokens.ndim in (1, 2) and tokens.size and np.issubdtype(tokens.dtype, np.integer):
            targets = task_targets(opened, record, tokens if tokens.ndim == 2 else tokens[None])
    params = opened.files.params(member)
    return forward(
        params, record["heads"], model_sizes(opened.files.config_field("model")), tokens, targets, weights, heads_off
    )
