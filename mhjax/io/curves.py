"""Scalar curves of one TensorBoard run, read without TensorFlow (which runs: io/workdir.py)."""

from __future__ import annotations

import numpy as np

# The trainer logs train/... scalars for every step of a chunk of up to this many steps, else
# means over windows of train_window(chunk) steps (mhjax.train.loop._log_chunk).
TRAIN_POINTS_PER_CHUNK = 50


def train_window(chunk_steps: int) -> int:
    """Steps per train/... point in TensorBoard for chunks of ``chunk_steps`` steps."""
    return max(1, -(-int(chunk_steps) // TRAIN_POINTS_PER_CHUNK))


def read_run(path: str) -> dict:
    """{tag: (steps, values)} of every scalar tag of the run at ``path``. A resumed run may log a
    step twice: the last value wins."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # slow import: only here

    events = EventAccumulator(path, size_guidance={"scalars": 0, "images": 1, "tensors": 1, "histograms": 1})
    events.Reload()
    out = {}
    for tag in sorted(events.Tags().get("scalars", [])):
        by_step = {e.step: e.value for e in events.Scalars(tag)}
        steps = sorted(by_step)
        out[tag] = (np.array(steps), np.array([by_step[s] for s in steps], float))
    return out
