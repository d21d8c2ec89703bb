"""W/progress.json: where a training run is, for ``mhjax status`` to read while it runs.

    {"pid", "host", "members": [...], "total_steps", "step", "started_step", "updated",
     "member_steps_per_s", "diverged": [...], "phase"}

The run's process 0 writes it (atomically: io/results.write_json) when the run starts, before its
restore and compile (``"phase": "starting"``, no rate), then when training starts and at every
chunk end (``"phase": "training"``): the step reached (beyond the latest checkpoint), the sweep's member-steps/s
over this run so far (logging and evaluation included, so a time to finish from it holds), and
the members that diverged so far. A sweep that grew writes one per part, beside the part's
checkpoints. It is a view, never read back by training: a killed run's file stays behind, and
readers tell a live run from it by the workdir lock's holder (io/lock.py).
"""

from __future__ import annotations

import json
import os
import socket
import time

from mhjax.io.results import write_json

FILE = "progress.json"


def path_of(workdir) -> str:
    """The progress file of ``workdir`` (a Workdir or a part's view): beside its checkpoints."""
    return os.path.join(os.path.dirname(workdir.checkpoints_dir), FILE)


class Progress:
    """Writes a run's progress file (``write=False``: the processes other than 0, which do not)."""

    def __init__(self, workdir, members: list[str], total: int, step: int, write: bool = True):
        self.path, self.write = path_of(workdir), write
        self.members, self.total, self.started_step = list(members), int(total), int(step)
        self.started = time.time()

    def starting(self) -> None:
        """Written as the run starts, before its restore and compile: ``mhjax status`` tells it
        from the stopped run whose file it replaces (io/sweep_state.py)."""
        self.update(self.started_step, phase="starting")

    def update(self, step: int, diverged=(), phase: str = "training") -> None:
        if not self.write or self.started_step >= self.total:  # a run that trains nothing leaves it as it was
            return
        now = time.time()
        trained = (int(step) - self.started_step) * len(self.members)
        rate = trained / (now - self.started) if trained and now > self.started and phase == "training" else None
        payload = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "members": self.members,
            "total_steps": self.total,
            "step": int(step),
            "started_step": self.started_step,
            "updated": now,
            "member_steps_per_s": rate,
            "diverged": sorted(diverged),
            "phase": phase,
        }
        try:
            write_json(self.path, payload)
        except OSError:  # a view of the run: a full disk must not stop training (checkpoints say so)
            pass


def read(workdir) -> dict | None:
    """The progress file of ``workdir`` (or a part's view), or None (none, or unreadable)."""
    try:
        with open(path_of(workdir)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
