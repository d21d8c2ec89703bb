"""Snapshot steps a resumed run asks for that lie before its checkpoint (config.train.snapshot_steps
changed since the workdir's run: io/metadata.py records the change in mhjax.json).

Step 0 is theta_0, which the initialisation recomputes exactly from the config seed: it is taken.
Any other step's parameters were not kept: it is named in one line, and the run goes on."""

from __future__ import annotations

from mhjax.train.snapshots import FIELD


def take_passed(snaps, sweep, resumed_at: int, log) -> list[int]:
    """Take step 0 of ``snaps`` (train/snapshots.Snapshots) when it is wanted and not on disk, and
    say which other wanted steps before ``resumed_at`` are not; returns those."""
    passed = sorted(k for k in snaps.steps if k < resumed_at and k not in snaps.written)
    if 0 in passed:
        snaps.take(0, sweep.init_states())
        log(f"config.{FIELD}: step 0 taken (theta_0, initialised again from the config seed)")
    gone = [k for k in passed if k]
    if gone:
        steps = ", ".join(map(str, gone))
        log(
            f"config.{FIELD}: step{'s' * (len(gone) > 1)} {steps} passed before this run (resumed at step "
            f"{resumed_at}) and {'were' if len(gone) > 1 else 'was'} not kept: no snapshot there; "
            "a new workdir trains them"
        )
    return gone
