"""Per-window held-out losses kept beside results.json: ``W/eval_windows/<member>.npy``.

Each file is one member's float64 array (2, N): per held-out window, the weighted sum of its
token losses (nats) and the sum of its weights (analysis/paired.py), the windows in the order of
its evaluation. Members whose ``eval_set`` (results.json) is equal were scored on the same
windows, so their files pair window by window. ``W/eval_windows/<task>.starts.npy``: where a
corpus task's held-out windows start in its held-out part (text: the same for every member).
"""

from __future__ import annotations

import os

import numpy as np

from mhjax.io.results import WriteFailed

FOLDER = "eval_windows"
FIELD = "eval_window_sums"  # the member field results carry them in, until written here
VALIDATION_FIELD = "val_window_sums"  # the validation set's, written as <member>.validation.npy
STARTS = "eval_window_starts"  # the payload's {task: offsets}, until written here
ARRAYS = "eval_window_arrays"  # the payload's {file name: array} (starts, clusters), until written here


def _name(member: str) -> str:
    return member.replace(os.sep, "_")  # a file name, whatever the member name holds


def save(folder: str, payload: dict) -> dict:
    """Write the members' ``FIELD`` arrays and the payload's ``STARTS`` to ``folder`` and take
    them out of ``payload`` (in place: what stays is JSON); returns ``payload``."""
    arrays = {_name(m["name"]): m.pop(FIELD) for m in payload["members"] if FIELD in m}
    arrays.update(
        {_name(m["name"]) + ".validation": m.pop(VALIDATION_FIELD) for m in payload["members"] if VALIDATION_FIELD in m}
    )
    arrays.update({f"{_name(task)}.starts": s for task, s in (payload.pop(STARTS, None) or {}).items()})
    arrays.update({_name(name): a for name, a in (payload.pop(ARRAYS, None) or {}).items()})
    if arrays:
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as exc:
            raise WriteFailed(folder, exc) from None
    for name, array in arrays.items():
        tmp, path = os.path.join(folder, name + ".tmp.npy"), os.path.join(folder, name + ".npy")
        try:
            np.save(tmp, np.asarray(array))
            os.replace(tmp, path)  # a kill leaves the old file or the new one
        except OSError as exc:  # a full disk: one line naming the file (results.WriteFailed)
            if os.path.lexists(tmp):
                os.remove(tmp)
            raise WriteFailed(path, exc) from None
    return payload


def read(folder: str, member: str) -> np.ndarray | None:
    """``member``'s per-window sums (2, N), or None when the workdir has none (written before them);
    any other file of the folder by its name less ``.npy`` (``<task>.clusters``, ...)."""
    path = os.path.join(folder, _name(member) + ".npy")
    return np.load(path) if os.path.isfile(path) else None
