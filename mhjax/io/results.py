"""results.json and results.md of a sweep."""

from __future__ import annotations

import json
import math
import os

import numpy as np

from mhjax.config import ConfigError

CORE_COLUMNS = (
    "name",
    "task",
    "heads",
    "seed",
    "params",
    "steps",
    "train_loss",
    "eval_loss",
    "eval_accuracy",
    "wall_time_s",
    "status",
)


def read_workdir_json(workdir: str, name: str, missing_hint: str) -> dict:
    """A JSON object from a sweep workdir; every problem is a one-line ConfigError."""
    path = os.path.join(workdir, name)
    if not os.path.isdir(workdir):
        raise ConfigError(f"--workdir: no such directory: {workdir}")
    if not os.path.isfile(path):
        raise ConfigError(f"--workdir: {workdir} has no {name}; {missing_hint}")
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--workdir: {path} is unreadable ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--workdir: {path} is not a JSON object")
    return data


def load_analysis(workdir: str) -> dict | None:
    """W/analysis/analysis.json (written by ``mhjax analyze --workdir W``), or None if absent or unreadable."""
    path = os.path.join(workdir, "analysis", "analysis.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


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


def write_json(path: str, payload) -> None:
    """Write ``payload`` (made JSON-ready) atomically: a kill leaves the old file or the new one."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(json_ready(payload), f, indent=2)
    os.replace(tmp, path)


def write_results(workdir: str, payload: dict) -> None:
    members = [{k: json_ready(v) for k, v in m.items()} for m in payload["members"]]
    write_json(os.path.join(workdir, "results.json"), {**payload, "members": members})
    with open(os.path.join(workdir, "results.md"), "w") as f:
        f.write(markdown_table(members, payload.get("title", "Results")))


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def markdown_table(members: list[dict], title: str, columns=None) -> str:
    if not members:
        return f"# {title}\n\n(no members)\n"
    columns = columns or [c for c in CORE_COLUMNS if c in members[0]] + [
        c for c in members[0] if c not in CORE_COLUMNS and not isinstance(members[0][c], (list, dict))
    ]
    lines = [f"# {title}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for m in members:
        lines.append("| " + " | ".join(_fmt(m.get(c)) for c in columns) + " |")
    return "\n".join(lines) + "\n"
