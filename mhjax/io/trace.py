"""W/trace/: the per-step scalars a recipe traces (engine.Recipe.trace), one binary file per member.

    W/trace/format.json     {"dtype": [[name, numpy type], ...], "dense_steps", "per_decade"}
    W/trace/<member>.bin    fixed-size little-endian records (step int64, then each field float32),
                            steps ascending

Which steps are kept (``kept``): every step up to ``DENSE_STEPS`` (10^4), then about ``PER_DECADE``
log-spaced steps per decade: step s is kept where floor(PER_DECADE * log10 s) first reaches a new
value. The rule depends on the step alone, so it does not depend on how training was cut into
chunks, resumed or extended.

Writing appends one chunk's records to each member's file (open, write, close). A kill can
leave a partial record at the end: readers drop it. A run that resumes from a checkpoint at step
S first cuts each member's file before its first record at a step >= S (rows written after that
checkpoint are trained again), so resuming, a kill -9 and training longer leave no duplicates and
no gaps. The trace is kept apart from results.json and from the checkpoints' records.
"""

from __future__ import annotations

import json
import os

import numpy as np

from mhjax.config import ConfigError
from mhjax.io.results import write_json
from mhjax.io.shared_write import SharedWrite

DENSE_STEPS = 10_000
PER_DECADE = 1_000
FORMAT = "format.json"


def kept(steps) -> np.ndarray:
    """Boolean mask of the steps (ints >= 0) whose rows the trace keeps."""
    steps = np.asarray(steps, np.int64)
    with np.errstate(divide="ignore"):
        bins = lambda s: np.floor(PER_DECADE * np.log10(np.maximum(s, 1).astype(np.float64)))  # noqa: E731
        return (steps <= DENSE_STEPS) | (bins(steps) > bins(steps - 1))


def kept_rows(start: int, length: int) -> np.ndarray:
    """Row indices of a chunk of ``length`` steps from step ``start`` (row t: step start + t) kept."""
    return np.nonzero(kept(np.arange(start, start + length)))[0]


def record_dtype(fields) -> np.dtype:
    return np.dtype([("step", "<i8")] + [(f, "<f4") for f in fields])


class TraceWriter:
    """Appends the traced rows of each chunk (``append``) under ``folder``, first cutting every
    member's file back to the steps before ``start`` (the step training resumes from)."""

    def __init__(self, folder: str, start: int):
        self.folder, self.start = os.fspath(folder), int(start)
        self._dtype = None
        self._cut: set[str] = set()  # members whose file was cut back to ``start`` by this run

    def append(self, names: list[str], trace: dict | None, start: int) -> None:
        """``trace`` {field: host array (steps, members)} of a chunk from step ``start``, column j
        member ``names[j]``; None or {}: nothing traced."""
        if not trace:
            return
        dtype = self._format(sorted(trace))
        rows = kept_rows(start, len(next(iter(trace.values()))))
        for j, name in enumerate(names):
            records = np.zeros(rows.size, dtype)
            records["step"] = start + rows
            for field, values in trace.items():
                records[field] = np.asarray(values)[rows, j]
            path = self._path(name)
            if name not in self._cut:
                _cut(path, dtype, self.start)
                self._cut.add(name)
            with open(path, "ab") as f:
                f.write(records.tobytes())

    def _path(self, name: str) -> str:
        return os.path.join(self.folder, f"{name}.bin")

    def _format(self, fields) -> np.dtype:
        if self._dtype is None:
            os.makedirs(self.folder, exist_ok=True)
            self._dtype = record_dtype(fields)
            with SharedWrite(os.path.dirname(os.path.abspath(self.folder))):  # shards start at once
                self._check_format()
        return self._dtype

    def _check_format(self) -> None:
        """format.json written, or checked against this run's fields (under the shared lock)."""
        stored = _stored_dtype(self.folder)
        if stored is not None and stored != self._dtype:  # another mhjax's fields: begin again
            for entry in os.listdir(self.folder):
                if entry.endswith(".bin"):
                    os.remove(os.path.join(self.folder, entry))
        if stored != self._dtype:
            layout = {"dtype": [[n, self._dtype[n].str] for n in self._dtype.names]}
            write_json(
                os.path.join(self.folder, FORMAT), {**layout, "dense_steps": DENSE_STEPS, "per_decade": PER_DECADE}
            )


class NoTrace:
    """A process that writes no files (not process 0 of several)."""

    def append(self, names, trace, start) -> None:
        pass


def _stored_dtype(folder: str) -> np.dtype | None:
    path = os.path.join(folder, FORMAT)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return np.dtype([tuple(field) for field in json.load(f)["dtype"]])


def _records(path: str, dtype: np.dtype) -> np.ndarray:
    """The whole records of a member's file (a partial last one, from a kill, left out)."""
    size = os.path.getsize(path) // dtype.itemsize
    return np.fromfile(path, dtype, count=size)


def _cut(path: str, dtype: np.dtype, start: int) -> None:
    """Cut the file before its first record at a step >= ``start`` (and any partial record)."""
    if not os.path.exists(path):
        return
    steps = _records(path, dtype)["step"]
    os.truncate(path, int(np.searchsorted(steps, start, side="left")) * dtype.itemsize)


class Trace(dict):
    """A member's trace: {"step": ..., field: ...} numpy arrays, each key an attribute too
    (``trace.loss`` is ``trace["loss"]``): set once from the fields, so a misspelt name is an
    AttributeError (no ``__getattr__`` that would answer any name)."""

    def __init__(self, fields):
        super().__init__(fields)
        self.__dict__.update(self)


def has_trace(folder: str) -> bool:
    return os.path.exists(os.path.join(os.fspath(folder), FORMAT))


def read(folder: str, name: str) -> Trace:
    """{"step": int64 (rows,), field: float32 (rows,) ...} of member ``name``'s trace, keys as
    attributes too (Trace)."""
    folder = os.fspath(folder)
    dtype = _stored_dtype(folder)
    path = os.path.join(folder, f"{name}.bin")
    if dtype is None or not os.path.exists(path):
        raise ConfigError(
            f"trace: no per-step trace of {name!r} in {os.path.dirname(folder)} (a mixture sweep writes it)"
        )
    records = _records(path, dtype)
    return Trace((field, np.array(records[field])) for field in dtype.names)
