"""Targets outside the vocabulary, counted inside the training step and checked between chunks.

A task's targets are checked on a few draws before anything compiles (data/task_check.py); a
task whose targets leave [0, vocab_size) in 1 sequence of 200 passes that check, and the
cross-entropy of such a target is NaN, which used to read as a diverged member. The step counts
them instead (``target_range``: three reductions over the batch, positions of weight 0 left out),
and the host loop's ``check_chunk`` hook stops the run at the first chunk that has one: one
ConfigError naming the task, the value and the allowed range, raised before the chunk's state is
saved (the previous checkpoint stays the latest).

The counts are not logged to TensorBoard: a run that goes on has only zeros there, so
``check_chunk`` hands the loop the metrics without them.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from mhjax.config import ConfigError
from mhjax.experiments import task_params

KEYS = ("targets_out_of_range", "target_low", "target_high")


def target_range(targets, weights, vocab_size: int) -> dict:
    """{count of counted targets outside [0, vocab_size), the least and greatest of them (0 when
    none)} for one member's batch (``targets`` int, ``weights`` float, same shape)."""
    bad = (weights > 0) & ((targets < 0) | (targets >= vocab_size))
    zero = jnp.zeros_like(targets)
    return {
        "targets_out_of_range": jnp.sum(bad, dtype=jnp.int32),
        "target_low": jnp.min(jnp.where(bad, targets, zero)).astype(jnp.int32),
        "target_high": jnp.max(jnp.where(bad, targets, zero)).astype(jnp.int32),
    }


def check_chunk(experiment, program, metrics: dict, step: int) -> dict:
    """The chunk's metrics (host numpy, rows (steps, members) from ``step`` on) without the counts;
    ConfigError naming the task, the value and the range at the chunk's first out-of-range target."""
    counts = metrics.get("targets_out_of_range")
    if counts is not None and np.any(counts > 0):
        row, j = (int(a[0]) for a in np.nonzero(counts > 0))  # row-major: the earliest step first
        member = experiment.members[program.members[j]]
        low, high = int(metrics["target_low"][row, j]), int(metrics["target_high"][row, j])
        vocab = int(experiment.config.model.vocab_size)
        task = experiment.tasks[task_params.task_index(experiment.tasks, member)]
        raise ConfigError(
            f"config.sweep.task: task {member['task']!r} ({task.label()}) gave the target {low if low < 0 else high} "
            f"at step {step + row} of member {member.name}; targets must be in [0, {vocab - 1}] "
            f"(model.vocab_size = {vocab}): {int(counts[row, j])} such target(s) in that batch. "
            "Training stopped; nothing after the last checkpoint was saved"
        )
    return {k: v for k, v in metrics.items() if k not in KEYS}
