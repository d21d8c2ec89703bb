"""What the host loop (train/loop.py) writes to TensorBoard after a chunk and an evaluation."""

from __future__ import annotations

from mhjax.io.curves import train_points
from mhjax.train import status as member_status


def log_chunk(writers, members, idx, metrics, status, step, reported, log, factor, every_step=False, rates=None):
    """TensorBoard scalars of a chunk that ended at ``step``: ``train/...`` from the scan's per-step
    rows (io/curves.train_points: every step for chunks of up to io.curves.TRAIN_POINTS_PER_CHUNK
    steps, else means over windows of ``train_window(n)`` steps; ``every_step``, the experiment's
    log_every_step: every step io/trace.kept keeps). Row t of a chunk of n steps is the step that
    takes theta_{step-n+t} to the next: its loss is the loss of theta_{step-n+t}, logged at that
    step (a window's mean at its last row's step), so train/loss at s is the loss of theta_s.
    ``train/learning_rate`` at every step from ``rates`` (steps, members) where the experiment
    computes them, else at the chunk's end. Members that newly diverged are said on ``log``."""
    lr = status.get("learning_rate")
    n = metrics["loss"].shape[0]
    steps, points = train_points(metrics, step - n, every_step)
    points = {"train/loss": points.pop("train/loss"), **points}
    for j, i in enumerate(idx):
        for w, at in enumerate(steps):
            writers.scalars(members[i].name, {tag: float(m[w, j]) for tag, m in points.items()}, at)
        if rates is not None:
            for t in range(n):
                writers.scalars(members[i].name, {"train/learning_rate": float(rates[t, j])}, step - n + t)
        elif lr is not None:
            writers.scalars(members[i].name, {"train/learning_rate": float(lr[j])}, step)
    for name, line in member_status.chunk_messages([m.name for m in members], idx, status, reported, factor):
        log(line)
        writers.text(name, "status", line, step)


def log_eval(writers, members, evaluation, step):
    """``eval/...`` scalars of every member's evaluation at ``step``."""
    for i, m in enumerate(members):
        writers.scalars(m.name, {f"eval/{k.removeprefix('eval_')}": v for k, v in evaluation[i].items()}, step)
