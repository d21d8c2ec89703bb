"""The results of a sweep as JSON and a Markdown table, and atomic file writes (names: io/workdir.py)."""

from __future__ import annotations

import errno
import json
import math
import os

import numpy as np

# results.json keys kept under an older name beside the new one, for scripts that read them;
# tables and TensorBoard show only the new name.
OLD_NAMES = {"wall_time_s": "program_wall_time_s"}
CORE_COLUMNS = (
    "name",
    "task",
    "task_params",
    *("width", "num_layers", "mlp_dim", "dropout", "head_dim"),  # architecture axes (experiments/architecture.py)
    "heads",
    "seed",
    "params",
    "steps",
    "train_loss",
    "eval_loss",
    "eval_accuracy",
    "program_wall_time_s",
    "status",
)


def json_ready(value):
    """``value`` with non-finite floats as None (JSON has no NaN) and numpy scalars as Python ones."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value


RUN_FIELDS = ("resumed_from_step", "member_steps_per_s", "tokens_per_s", "mfu")  # of the run that trained


def kept_results(path: str, table: str, payload: dict) -> dict | None:
    """results.json's content at ``path`` where it and its ``table`` (results.md) exist and it
    already says what ``payload`` would, else None: a run that trained nothing more (resumed where
    it ended, e.g. for other snapshots) keeps the results of the run that trained, their
    ``resumed_from_step`` included."""
    try:
        with open(path) as f:
            stored = json.load(f) if os.path.isfile(table) else None
    except (OSError, ValueError):  # missing or unreadable: written
        return None
    now = json.loads(json.dumps(json_ready(payload)))
    if not isinstance(stored, dict):
        return None
    # what describes the run that trained (where it resumed, its rates) is kept by one that did not
    ran = {k: stored[k] for k in RUN_FIELDS if k in stored and (k == "resumed_from_step" or k not in now)}
    return stored if {**now, **ran} == stored else None


def write_json(path: str, payload, sort_keys: bool = False) -> None:
    """Write ``payload`` (made JSON-ready) atomically: a kill leaves the old file or the new one."""
    write_text(path, json.dumps(json_ready(payload), indent=2, sort_keys=sort_keys))


def write_text(path: str, text: str) -> None:
    """Write ``text`` atomically (a temporary file renamed into place): a kill or a full disk
    leaves the old file (the temporary one is removed); failing raises WriteFailed naming ``path``."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise WriteFailed(path, exc) from None


class WriteFailed(OSError):
    """A file could not be written (a full disk, a quota, permissions): one line naming it and
    what still holds (``hint``). ``errno`` is the cause's (ENOSPC for a full disk)."""

    def __init__(self, path: str, cause: BaseException, hint: str = ""):
        code = getattr(cause, "errno", None) or (errno.ENOSPC if _disk_full(cause) else errno.EIO)
        super().__init__(code, os.strerror(code), str(path))
        self.hint = hint

    def __str__(self) -> str:
        return f"cannot write {self.filename} ({self.strerror}){self.hint}"


def _disk_full(exc: BaseException) -> bool:
    return "No space left on device" in str(exc)


def os_error_in(exc: BaseException) -> BaseException | None:
    """The OSError behind ``exc`` (itself, its cause or context), or an error that reports a full
    disk in words (tensorstore's); None when ``exc`` is not about the file system."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) or _disk_full(exc):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def number_text(value, fmt: str = "{:.4g}") -> str:
    """``value`` as ``fmt`` says, except a nonzero number below 1e-3 in absolute value, which is
    written in scientific notation (``1.23e-05``), so that a small loss never reads ``0.0000``;
    ``-`` for None. The one number format of the console table, results.md and report.md."""
    if value is None:
        return "-"
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and 0 < abs(value) < 1e-3:
        return f"{value:.2e}"
    return fmt.format(value)


def params_text(params) -> str:
    """A member's task parameters as one cell, e.g. ``cap=2`` (``pairs=8, cap=2``); ``-`` for none."""
    if not isinstance(params, dict) or not params:
        return "-"
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


# fields whose None is a setting, not a missing value: head_dim None is parameter matching
NONE_IS_A_VALUE = ("head_dim",)


def _fmt(value, column: str = "") -> str:
    if value is None and column in NONE_IS_A_VALUE:
        return "None"
    if isinstance(value, dict):
        return params_text(value)
    if isinstance(value, float):
        return number_text(value)
    return "-" if value is None else str(value)


def diverged_lines(members: list[dict]) -> list[str]:
    """Markdown lines naming every diverged member and why (none: no lines)."""
    bad = [m for m in members if m.get("status") == "diverged"]
    if not bad:
        return []
    lines = [f"**Diverged: {len(bad)} of {len(members)} members** (left out of every mean):", ""]
    return lines + [f"- `{m['name']}`: {m.get('diverged_reason') or 'diverged'}" for m in bad] + [""]


def markdown_table(members: list[dict], title: str, columns=None) -> str:
    """A table of every member's fields, then the diverged members named with their reasons."""
    if not members:
        return f"# {title}\n\n(no members)\n"
    columns = columns or [c for c in CORE_COLUMNS if any(c in m for m in members)] + [
        c
        for c in members[0]
        if c not in CORE_COLUMNS and c not in OLD_NAMES and not isinstance(members[0][c], (list, dict))
    ]
    lines = [f"# {title}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for m in members:
        lines.append("| " + " | ".join(_fmt(m.get(c), c) for c in columns) + " |")
    bad = diverged_lines(members)
    return "\n".join(lines + ([""] + bad if bad else [])) + "\n"
