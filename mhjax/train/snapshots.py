"""Snapshots: every member's parameters (not its optimizer state) at chosen steps, kept for good
under W/snapshots/<step>/ beside the two rolling resume checkpoints (io/workdir.py reads them).

``config.train.snapshot_steps`` (optional; absent or empty: none) is a tuple of steps, ``"log:N"``
(step 0 plus N-1 steps log-spaced from 1 up to train.steps, which is included) or ``"lin:N"``
(step 0 plus N-1 evenly spaced steps up to train.steps), each rounded to a whole step. Every step
in [0, train.steps] is taken exactly where the host loop stops, with no program of its own: a
chunk that holds snapshot steps is cut there into pieces, all run by ONE program
(engine.make_partial_chunk, the one early evaluations already use: at most one more compile for
the run, none when evaluations already cut the first chunk). The cut changes no number (the
pieces run the chunk's own step; tested bit for bit), nor where evaluations and checkpoints fall
(the host loop skips cuts for them); TensorBoard's train/ points average over windows of each
piece instead of the whole chunk (io/curves.train_points). Chunk ends stay
multiples of train.chunk_steps across resumes (ahead.chunk_plan), so a resumed or longer run
takes the snapshots of the straight run. A snapshot already on disk is not written
again (a run killed after writing it and resumed from an earlier checkpoint retrains the same
parameters), and orbax writes each one into a temporary folder renamed into place when complete:
a kill loses none that was written.

Snapshot steps a resumed run asks for that lie before its checkpoint (config.train.snapshot_steps
changed since the workdir's run: io/metadata.py records the change in mhjax.json): step 0 is
theta_0, which the initialisation recomputes exactly from the config seed, so it is taken; any
other step's parameters were not kept: it is named in one line, and the run goes on
(``Snapshots.take_passed``).
"""

from __future__ import annotations

import math

import jax
import numpy as np

from mhjax.config import ConfigError
from mhjax.io.checkpoint import member_key
from mhjax.io.workdir import Workdir
from mhjax.train.engine import unstack

FIELD = "train.snapshot_steps"
ALLOWED = 'a tuple of steps in [0, train.steps], "log:N" or "lin:N" (N >= 2)'
SPACINGS = ("log", "lin")


def resolve(value, total: int) -> tuple[int, ...]:
    """The snapshot steps of ``value`` (config.train.snapshot_steps) for a run of ``total`` steps,
    ascending; bad values raise ConfigError naming the field."""
    if value is None:
        return ()
    if isinstance(value, (tuple, list)) and len(value) == 1 and isinstance(value[0], str):
        value = value[0]  # "--config.train.snapshot_steps=log:4" over a tuple in the file
    if isinstance(value, str):
        text = value.strip()
        if text[:4] in (f"{s}:" for s in SPACINGS):
            return _spaced_steps(text, total)
        if text.lower() in ("none", "off"):
            return ()
        try:  # "0,100,1000" or "()" as typed on the command line over a "log:N" in the file
            value = tuple(int(part) for part in text.strip("()[] ").split(",") if part.strip())
        except ValueError:
            raise ConfigError(f"config.{FIELD}: must be {ALLOWED}; got {value!r}") from None
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,)
    if not isinstance(value, (tuple, list)):
        raise ConfigError(f"config.{FIELD}: must be {ALLOWED}; got {value!r}")
    steps = set()
    for k in value:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k <= total:
            raise ConfigError(f"config.{FIELD}: each step must be an integer in [0, train.steps={total}]; got {k!r}")
        steps.add(int(k))
    return tuple(sorted(steps))


def _spaced_steps(text: str, total: int) -> tuple[int, ...]:
    """ "log:N" or "lin:N": step 0 and N-1 steps up to ``total`` (log-spaced from 1, or evenly
    spaced), rounded to whole steps (fewer where two round to one step)."""
    spacing, count = text[:3], text[4:].strip()
    if not count.isdigit() or int(count) < 2:
        raise ConfigError(f'config.{FIELD}: "{spacing}:N" needs an integer N >= 2 (step 0 and N-1 more); got {text!r}')
    n = int(count) - 1
    if spacing == "log":
        ends = [total] if n == 1 else np.geomspace(1, total, n)
    else:
        ends = np.linspace(0, total, n + 1)[1:]
    return tuple(sorted({0, total, *(int(round(float(k))) for k in ends)}))


def steps_of(config) -> tuple[int, ...]:
    """config.train.snapshot_steps resolved for its run (``resolve``)."""
    return resolve(config.train.get("snapshot_steps"), config.train.steps)


def params_bytes(sweep) -> int:
    """Bytes of one member's parameters as a snapshot stores them (every member is padded to
    its program's shapes), the largest over the programs."""
    out = 0
    for shapes in sweep.abstract_states().values():
        leaves = jax.tree_util.tree_leaves(shapes.params)
        out = max(out, sum(math.prod(x.shape[1:]) * np.dtype(x.dtype).itemsize for x in leaves))
    return out


def disk_line(sweep, steps) -> str:
    """The dry run's line: what the snapshots will take on disk."""
    if not steps:
        return f"snapshots: none (config.{FIELD})"
    members, each = len(sweep.experiment.members), params_bytes(sweep)
    total = each * members * len(steps)
    listed = ", ".join(map(str, steps))
    return (
        f"snapshots: {len(steps)} (steps {listed}) x {members} members x {_size(each)} of parameters = "
        f"{_size(total)} on disk under W/{Workdir.SNAPSHOTS}/"
    )


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{int(n)} B"


class Snapshots:
    """The host loop's writer: ``take(step, states)`` at each chunk end writes every member's
    parameters when ``step`` is a snapshot step that is not on disk yet; ``take_passed`` on resuming."""

    def __init__(self, sweep, workdir, steps):
        self.sweep, self.steps = sweep, set(steps)
        self.store = workdir.snapshotter() if self.steps else None
        self.written = set(workdir.snapshot_steps()) if self.steps else set()

    def take(self, step: int, states) -> bool:
        if step not in self.steps or step in self.written:
            return False
        sweep = self.sweep
        host = sweep.host({name: state.params for name, state in states.items()})
        params = unstack(sweep.programs, host)
        members = sweep.experiment.members
        tree = {"members": {member_key(members[i].name): {"params": p} for i, p in params.items()}}
        self.store.save(step, tree)
        self.written.add(step)
        return True

    def take_passed(self, resumed_at: int, log) -> list[int]:
        """Take step 0 when it is wanted and not on disk, and say which other wanted steps before
        ``resumed_at`` are not; returns those."""
        passed = sorted(k for k in self.steps if k < resumed_at and k not in self.written)
        if 0 in passed:
            self.take(0, self.sweep.init_states())
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

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
