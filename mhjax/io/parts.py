"""A sweep that grew (workflows/growth.py) is kept in parts: the members of its first run in
W/checkpoints and W/snapshots, each later addition in W/grown/<n>/checkpoints and
W/grown/<n>/snapshots. mhjax.json's ``sweep_history`` lists them (io/metadata.HISTORY); the
TensorBoard runs, traces and results.json stay shared, one entry per member.

Here: which parts a workdir has, the steps every part holds, and results.json merged from a
part's payload, leaving every other part's entries exactly as they were."""

from __future__ import annotations

import os

from mhjax.config import ConfigError
from mhjax.io.metadata import HISTORY

GROWN = "grown"  # W/grown/<n>/: the members added to a sweep the n-th time


def folder(n: int) -> str:
    """The folder of the sweep's n-th addition (n >= 1), relative to the workdir."""
    return f"{GROWN}/{n}"


def folders(metadata: dict, where: str) -> list[str]:
    """The parts' folders, the first run's ("") first; one part unless the sweep grew."""
    history = metadata.get(HISTORY)
    if not history:
        return [""]
    if not isinstance(history, list) or not all(
        isinstance(e, dict) and isinstance(e.get("folder"), str) for e in history
    ):
        raise ConfigError(f"--workdir: {where}'s {HISTORY} is unreadable (a list of parts with folders)")
    return [e["folder"] for e in history]


def steps_in(folder: str) -> list[int]:
    """The steps of a folder of orbax step directories (a save in progress has another name)."""
    return sorted(int(e) for e in os.listdir(folder) if e.isdigit()) if os.path.isdir(folder) else []


def common(step_lists: list[list[int]]) -> list[int]:
    """The steps every part holds, ascending: a state of the whole sweep exists only there."""
    steps = set(step_lists[0]) if step_lists else set()
    for more in step_lists[1:]:
        steps &= set(more)
    return sorted(steps)


def merge(stored: dict | None, payload: dict, part: str, order: list[str]) -> dict:
    """results.json's payload after part ``part`` trained: its members' entries replace or join
    the ``stored`` ones (whose entries stay as read), in the sweep's ``order``; its programs are
    named ``<part>:<program>`` beside the others' (two parts may both have an "h4" program)."""
    stored = stored or {}
    records = {m["name"]: m for m in stored.get("members", [])}
    programs = dict(stored.get("programs", {}))
    name = (lambda p: f"{part}:{p}") if part else (lambda p: p)  # noqa: E731
    for record in payload["members"]:
        records[record["name"]] = {**record, "program": name(record["program"])} if "program" in record else record
    for program, members in payload.get("programs", {}).items():
        programs[name(program)] = members
    names = [n for n in order if n in records] + [n for n in records if n not in order]
    return {**stored, **payload, "programs": programs, "members": [records[n] for n in names]}
