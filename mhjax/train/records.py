"""What the host accumulates during training that results.json reports, kept with each checkpoint.

The exact train losses L(theta_k) at the experiment's ``loss_steps()`` are picked on the host
from the chunks' per-step losses (results field ``loss_curve``). They are saved with every
checkpoint, as a JSON item in the same atomic step directory as the states (io/checkpoint.py),
so a run killed at any point and resumed reports the same curve as one that never stopped.
Beside them, ``zero_at_step``: the first step k (any k, not only a recorded one) whose loss is
at or below float32's smallest normal (0 or subnormal: ``LOSS_FLOOR``), read from every row.
The members' training seconds are part of the checkpoint tree itself. A checkpoint written
before records existed still resumes; its curves then start at its step (``restored`` says so).
"""

from __future__ import annotations

import numpy as np

# {member index: {"steps": [k, ...], "values": [L(theta_k), ...], ["zero_at_step": k]}}, k ascending
LossCurves = dict[int, dict]
LOSS_FLOOR = float(np.finfo(np.float32).tiny)  # a loss at or below it is 0 or subnormal (float32)


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
            low = np.flatnonzero(losses[:, j] <= LOSS_FLOOR)  # NaN (a frozen member) is never low
            if "zero_at_step" not in curve and low.size:
                curve["zero_at_step"] = start + int(low[0])

    def to_json(self) -> dict:
        """The records as a JSON object keyed by member name (NaN stays NaN: a diverged member)."""
        return {"loss_curves": {self.names[i]: curve for i, curve in sorted(self.loss_curves.items())}}

    def load_json(self, records: dict | None, step: int) -> None:
        """Replace the records by those saved with checkpoint ``step`` (None: it has none)."""
        self.starts_at = step if records is None else 0
        curves = (records or {}).get("loss_curves", {})
        index = {name: i for i, name in enumerate(self.names)}
        self.loss_curves = {index[name]: _curve(c) for name, c in curves.items() if name in index}


def _curve(saved: dict) -> dict:
    """A saved curve; one saved before ``zero_at_step`` existed takes it from its recorded points."""
    curve = {"steps": [int(k) for k in saved["steps"]], "values": [float(v) for v in saved["values"]]}
    zero = saved.get("zero_at_step")
    if "zero_at_step" not in saved:
        zero = next((k for k, v in zip(curve["steps"], curve["values"]) if v <= LOSS_FLOOR), None)
    if zero is not None:
        curve["zero_at_step"] = int(zero)
    return curve
