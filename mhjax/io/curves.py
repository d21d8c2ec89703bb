"""Scalar curves of a sweep's TensorBoard runs (W/tb/<member>), read without TensorFlow."""

from __future__ import annotations

import os

import numpy as np

# The trainer logs train/... scalars for every step of a chunk of up to this many steps, else
# means over windows of train_window(chunk) steps (mhjax.train.loop._log_chunk).
TRAIN_POINTS_PER_CHUNK = 50


def train_window(chunk_steps: int) -> int:
    """Steps per train/... point in TensorBoard for chunks of ``chunk_steps`` steps."""
    return max(1, -(-int(chunk_steps) // TRAIN_POINTS_PER_CHUNK))


def read_curves(workdir: str, names: list[str], tags=None) -> dict:
    """{member: {tag: (steps, values)}} from the members' runs; a missing run or tag is left out.

    ``tags=None``: ``train/loss`` and every ``eval/...`` tag. A resumed run may log a step
    twice: the last value wins.
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # slow import: only here

    out = {}
    for name in names:
        path = os.path.join(workdir, "tb", name)
        out[name] = {}
        if not os.path.isdir(path):
            continue
        events = EventAccumulator(path, size_guidance={"scalars": 0, "images": 1, "tensors": 1, "histograms": 1})
        events.Reload()
        available = set(events.Tags().get("scalars", []))
        wanted = (
            tags if tags is not None else sorted(t for t in available if t == "train/loss" or t.startswith("eval/"))
        )
        for tag in wanted:
            if tag in available:
                by_step = {e.step: e.value for e in events.Scalars(tag)}
                steps = sorted(by_step)
                out[name][tag] = (np.array(steps), np.array([by_step[s] for s in steps], float))
    return out
