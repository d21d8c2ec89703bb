"""results.json and results.md of a sweep."""
from __future__ import annotations

import json
import math
import os

CORE_COLUMNS = ("name", "task", "heads", "seed", "params", "steps", "train_loss", "eval_loss", "eval_accuracy", "wall_time_s", "status")


def read_workdir_json(workdir: str, name: str, missing_hint: str) -> dict:
    """A JSON object from a sweep workdir; every problem is a one-line ConfigError."""
    from mhjax.config import ConfigError

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


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN
    return value


def write_results(workdir: str, payload: dict) -> None:
    members = [{k: _clean(v) for k, v in m.items()} for m in payload["members"]]
    payload = {**payload, "members": members}
    tmp = os.path.join(workdir, "results.json.tmp")
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=2)
    os.replace(tmp, os.path.join(workdir, "results.json"))
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
