"""Scalar curves of one TensorBoard run, read without TensorFlow (which runs: io/workdir.py)."""

from __future__ import annotations

import numpy as np

from mhjax.io.trace import kept_rows

# The trainer logs train/... scalars for every step of a chunk of up to this many steps, else
# means over windows of train_window(chunk) steps (train_points; an experiment with
# log_every_step logs every step io/trace.kept keeps instead).
TRAIN_POINTS_PER_CHUNK = 50


def train_window(chunk_steps: int) -> int:
    """Steps per train/... point in TensorBoard for chunks of ``chunk_steps`` steps."""
    return max(1, -(-int(chunk_steps) // TRAIN_POINTS_PER_CHUNK))


def train_points(metrics: dict, start: int, every_step: bool):
    """(steps, {"train/<metric>": (points, members)}) that TensorBoard gets of a chunk's per-step
    rows (metrics: (steps, members) host arrays; row t is the step from theta_{start+t}, logged at
    step start + t): ``every_step``, the rows io/trace.kept keeps, as they are; else one point
    per window of ``train_window(n)`` rows, their mean at the window's last row's step (NaNs
    skipped, and infinities for the loss)."""
    n = len(next(iter(metrics.values())))
    if every_step:
        rows = kept_rows(start, n)
        return [start + int(t) for t in rows], {f"train/{k}": np.asarray(v)[rows] for k, v in metrics.items()}
    window = train_window(n)
    steps = [start + min(end, n) - 1 for end in range(window, n + window, window)]
    return steps, {f"train/{k}": window_means(v, window, finite_only=k == "loss") for k, v in metrics.items()}


def window_means(values, window: int, finite_only: bool):
    """(windows, members) means of a chunk's (steps, members) rows over consecutive windows of
    ``window`` steps (the last one may be shorter), skipping NaNs (``finite_only``: infinities too;
    none left: NaN). Equal bit for bit to a per-member, per-window ``np.nanmean``: each window is
    one contiguous row, which numpy sums pairwise as it does a 1-D slice."""
    values = np.asarray(values)
    n, m = values.shape
    rows = []
    for lo, hi in ((0, n - n % window), (n - n % window, n)):  # whole windows, then the short one
        if hi > lo:
            block = np.ascontiguousarray(
                values[lo:hi].reshape(-1, hi - lo if hi - lo < window else window, m).transpose(0, 2, 1)
            )
            rows.append(_row_means(block, finite_only))
    return np.concatenate(rows)


def _row_means(block, finite_only: bool):
    """Means over the last axis of ``block`` skipping what is not kept (np.nanmean's algorithm:
    zero-filled sum over kept count); rows with a dropped value are recomputed from the kept ones
    alone when ``finite_only``, as ``finite.mean()`` sums them."""
    kept = np.isfinite(block) if finite_only else ~np.isnan(block)
    count = kept.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = (np.where(kept, block, 0).sum(axis=-1) / count).astype(block.dtype)
    if finite_only:
        for w, j in zip(*np.nonzero(~kept.all(axis=-1) & (count > 0))):
            means[w, j] = block[w, j][kept[w, j]].mean()
    return np.where(count > 0, means, np.nan).astype(block.dtype)


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
