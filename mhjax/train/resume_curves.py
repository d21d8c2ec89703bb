"""TensorBoard at a resume: the points at the resumed step itself, and what the steps so far took.

A run resumed from the checkpoint at step s opens its TensorBoard runs with tensorboardX's
``purge_step=s`` (io/tensorboard.py): readers drop every point at steps >= s written before,
including those a killed process wrote after the checkpoint, which the resumed run writes
again (``train/...`` at s is the next chunk's first row). The points at s itself that the run
which wrote the checkpoint logged before it, ``train/learning_rate`` and the evaluation
(where one was due at s), are written again here from the restored state: the same
executables on the same state give the same numbers. Wall-time scalars
(``perf/member_steps_per_s``) are not: they would be another run's time.
"""

from __future__ import annotations

import json

import jax
import numpy as np
from jax.experimental import multihost_utils

from mhjax.train import ahead, engine


def crossed(previous: int, step: int, every: int) -> bool:
    """Whether a multiple of ``every`` (> 0) lies in (previous, step]."""
    return every > 0 and previous // every != step // every


def evaluation_due(previous: int, step: int, total: int, eval_every: int, evals) -> bool:
    """The host loop's rule (train/loop.py ``run``; keep the two alike): evaluate at the end of a
    chunk from ``previous`` to ``step``."""
    return crossed(previous, step, eval_every) or step == total or any(previous < k <= step for k in evals)


def evaluated_at(step: int, config, evals, finished_at: int | None) -> bool:
    """Whether the run that wrote the checkpoint at ``step`` evaluated there. The loop evaluates
    at the stops of a plan without snapshot cuts (chunk ends, the end, early evaluations; never
    at a snapshot's cut, where a signal may still have stopped it), which do not depend on
    resumes (ahead.chunk_plan): the straight run's rule, unless ``step`` was the end of a run
    trained longer since (``finished_at``)."""
    total, chunk = int(config.train.steps), int(config.train.chunk_steps)
    ends = np.cumsum([n for n, _ in ahead.chunk_plan(0, total, chunk, splits=evals).lengths()]).tolist()
    if step == finished_at:
        return True
    if step not in ends:
        return False
    previous = ([0] + ends)[ends.index(step)]
    return evaluation_due(previous, step, total, int(config.train.eval_every), evals)


def purged_everywhere(writers) -> bool:
    """Whether process 0's TensorBoard runs were purged (only it writes them), known to every
    process: writing the resumed step again evaluates, a collective every process must join."""
    if jax.process_count() == 1:
        return bool(writers.purged)
    return bool(multihost_utils.broadcast_one_to_all(np.int32(writers.purged)))


def rewrite_resumed_step(workdir, experiment, sweep, states, writers, step: int, evals, log_eval):
    """Write again the points at ``step`` (the checkpoint resumed from) that the purge dropped;
    returns the evaluation written (None where none was due). ``log_eval(writers, members,
    evaluation, step)``: how the host loop logs an evaluation."""
    members = experiment.members
    for program in sweep.programs:
        if experiment.learning_rates(program.members, step, 1) is not None:
            continue  # logged at every step from the schedule: the next chunk writes ``step`` itself
        status = sweep.host(engine.member_status(states[program.name]))
        if "learning_rate" in status:
            for j, i in enumerate(program.members):
                writers.scalars(members[i].name, {"train/learning_rate": float(status["learning_rate"][j])}, step)
    if not evaluated_at(step, experiment.config, evals, _finished_at(workdir)):
        return None
    evaluation = sweep.evaluate(states)
    log_eval(writers, members, evaluation, step)
    return evaluation


def _finished_at(workdir) -> int | None:
    """The step of the workdir's results.json (a finished run), or None."""
    try:
        with open(workdir.results_path) as f:
            return int(json.load(f)["steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def prior_step_seconds(sweep, seconds: dict, step: int) -> float | None:
    """Seconds per step of the whole sweep so far (each program's wall time, kept per member in
    the checkpoint: one member per program counts), or None at step 0."""
    if not step:
        return None
    names = [sweep.experiment.members[p.members[0]].name for p in sweep.programs]
    total = sum(float(seconds.get(name, 0.0)) for name in names)
    return total / step if total > 0 else None
