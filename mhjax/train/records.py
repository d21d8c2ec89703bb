"""What the host accumulates during training that results.json reports, kept with each checkpoint.

The exact train losses L(theta_k) at the experiment's ``loss_steps()`` are picked on the host
from the chunks' per-step losses (results field ``loss_curve``). They are saved with every
checkpoint, as a JSON item in the same atomic step directory as the states (io/checkpoint.py),
so a run killed at any point and resumed reports the same curve as one that never stopped.
The members' training seconds are part of the checkpoint tree itself. A checkpoint written
before records existed still resumes; its curves then start at its step (``restored`` says so).
"""

from __future__ import annotations

import numpy as np

# {member index: {"steps": [k, ...], "values": [L(theta_k), ...]}}, k ascending
LossCurves = dict[int, dict[str, list]]


class HostRecords:
    """The loss points of every member; ``wanted``: the steps k to record."""

    def __init__(self, member_names: list[str], wanted):
        self.names = list(member_names)
        self.wanted = np.array(sorted(set(wanted)), dtype=np.int64)
        self.loss_curves: LossCurves = {}
        self.starts_at = 0  # the step from which on the records are complete (0 unless restored without any)

    def record_losses(self, members: list[int], losses, start: int) -> None:
        """Append L(theta_k) for the wanted k in [start, start + chunk): the scan's row t holds
        the loss of the step's input, theta_{start+t}; column j is member ``members[j]``."""
        if not self.wanted.size:
            return
        losses = np.asarray(losses)
        inside = self.wanted[(self.wanted >= start) & (self.wanted < start + losses.shape[0])]
        for j, i in enumerate(members):
            curve = self.loss_curves.setdefault(i, {"steps": [], "values": []})
            curve["steps"] += [int(k) for k in inside]
            curve["values"] += [float(losses[k - start, j]) for k in inside]

    def to_json(self) -> dict:
        """The records as a JSON object keyed by member name (NaN stays NaN: a diverged member)."""
        return {"loss_curves": {self.names[i]: curve for i, curve in sorted(self.loss_curves.items())}}

    def load_json(self, records: dict | None, step: int) -> None:
        """Replace the records by those saved with checkpoint ``step`` (None: it has none)."""
        self.starts_at = step if records is None else 0
        curves = (records or {}).get("loss_curves", {})
        index = {name: i for i, name in enumerate(self.names)}
        self.loss_curves = {
            index[name]: {"steps": [int(k) for k in c["steps"]], "values": [float(v) for v in c["values"]]}
            for name, c in curves.items()
            if name in index
        }
