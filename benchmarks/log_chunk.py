"""Averaging one chunk's per-step training metrics for TensorBoard (train/loop._log_chunk).

A fake chunk: 64 members, 100 steps (window 2: 50 points per member), the loss and three more
metrics as float32 (steps, members) arrays, 1% NaN. The writers do nothing, so what is timed is
the averaging and the loop around it. ``before`` is the per-member, per-window np.nanmean loop
that _log_chunk used until issue 31; ``after`` is _log_chunk itself.

    .venv/bin/python benchmarks/log_chunk.py [--members 64] [--steps 100] [--repeat 5]
"""

from __future__ import annotations

import argparse
import timeit

import numpy as np

from mhjax.io.curves import train_window
from mhjax.io.tensorboard import NoWriters
from mhjax.train.loop import _log_chunk
from mhjax.train.members import Member


def log_chunk_before(writers, members, idx, metrics, step):
    n = metrics["loss"].shape[0]
    window = train_window(n)
    for j, i in enumerate(idx):
        for end in range(window, n + window, window):
            rows = slice(end - window, min(end, n))
            losses = metrics["loss"][rows, j]
            finite = losses[np.isfinite(losses)]
            values = {"train/loss": float(finite.mean()) if finite.size else float("nan")}
            values.update({f"train/{k}": float(np.nanmean(v[rows, j])) for k, v in metrics.items() if k != "loss"})
            writers.scalars(members[i].name, values, step - n + min(end, n))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--members", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    m, n = args.members, args.steps
    metrics = {}
    for key in ("loss", "accuracy", "grad_norm", "param_norm"):
        values = rng.standard_normal((n, m)).astype(np.float32)
        values[rng.random((n, m)) < 0.01] = np.nan
        metrics[key] = values
    members = [Member(f"m{i}", {"seed": i}) for i in range(m)]
    idx = list(range(m))
    status = {"diverged": np.zeros(m, bool), "diverged_at": np.zeros(m, int)}
    writers = NoWriters()
    before = min(
        timeit.repeat(lambda: log_chunk_before(writers, members, idx, metrics, n), number=1, repeat=args.repeat)
    )
    after = min(
        timeit.repeat(
            lambda: _log_chunk(writers, members, idx, metrics, status, n, set(), print), number=1, repeat=args.repeat
        )
    )
    print(f"{m} members, {n} steps, window {train_window(n)}: before {before * 1e3:.1f} ms, after {after * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
