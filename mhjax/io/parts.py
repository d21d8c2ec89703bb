"""A sweep that grew (workflows/growth.py) is kept in parts: the members of its first run in
W/checkpoints and W/snapshots, each later addition in W/grown/<n>/checkpoints and
W/grown/<n>/snapshots. mhjax.json's ``sweep_history`` lists them (io/metadata.HISTORY); the
TensorBoard runs, traces and results.json stay shared, one entry per member.

A sweep trained as N independent shards (workflows/shards.py, ``mhjax train --shard I/N``) is
kept the same way: shard I's members in W/shards/<I>/, its history entry marked ``"shard": "I/N"``.
Its programs keep their names (a shard trains the one-job run's programs), and results.json
names the members no shard has written yet in ``missing_members``.

Here: which parts a workdir has, the steps every part holds, and results.json merged from a
part's payload, leaving every other part's entries exactly as they were."""

from __future__ import annotations

import os

from mhjax.config import ConfigError
from mhjax.io.metadata import HISTORY

GROWN = "grown"  # W/grown/<n>/: the members added to a sweep the n-th time
SHARDS = "shards"  # W/shards/<i>/: the members of shard i of a sweep trained as independent shards
MISSING = "missing_members"  # results.json: the sweep's members not written yet (a shard still to finish)


def folder(n: int) -> str:
    """The folder of the sweep's n-th addition (n >= 1), relative to the workdir."""
    return f"{GROWN}/{n}"


def shard_folder(index: int) -> str:
    """The folder of shard ``index`` of a sharded sweep, relative to the workdir."""
    return f"{SHARDS}/{index}"


def shard_count(metadata: dict) -> int | None:
    """N of a sweep trained as N shards (its history's ``"shard": "I/N"``), else None."""
    history = metadata.get(HISTORY)
    marks = [e.get("shard") for e in history if isinstance(e, dict)] if isinstance(history, list) else []
    counts = {m.split("/")[1] for m in marks if isinstance(m, str) and m.partition("/")[2].isdigit()}
    return int(counts.pop()) if len(counts) == 1 else None


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


def common(step_lists: list[list[int]], started_only: bool = False) -> list[int]:
    """The steps every part holds, ascending: a state of the whole sweep exists only there.
    ``started_only``: of the parts that hold any (shards train apart: one not started yet
    leaves the others readable)."""
    if started_only:
        step_lists = [s for s in step_lists if s]
    steps = set(step_lists[0]) if step_lists else set()
    for more in step_lists[1:]:
        steps &= set(more)
    return sorted(steps)


def merge(stored: dict | None, payload: dict, part: str, order: list[str], program_names: dict | None = None) -> dict:
    """results.json's payload after part ``part`` trained: its members' entries replace or join
    the ``stored`` ones (whose entries stay as read), in the sweep's ``order``. A grown part's
    programs are named ``<part>:<program>`` beside the others' (two parts may both have an "h4"
    program); a shard's take the one-job run's names, ``program_names`` {member: program} (a subset's
    programs may be named otherwise: "h4" alone, "a16-h4" beside other head sizes), and a program
    split over shards lists all its members. ``missing_members``: the members of ``order`` no part
    has written yet (absent when none)."""
    stored = stored or {}
    records = {m["name"]: m for m in stored.get("members", [])}
    programs = dict(stored.get("programs", {}))
    grown = part.startswith(GROWN)
    position = {n: i for i, n in enumerate(order)}
    at = lambda n: position.get(n, len(order))  # noqa: E731

    def name(program: str, member: str) -> str:
        return f"{part}:{program}" if grown else (program_names or {}).get(member, program)

    for record in payload["members"]:
        if "program" in record:
            record = {**record, "program": name(record["program"], record["name"])}
        records[record["name"]] = record
    incoming: dict[str, list] = {}
    for program, members in payload.get("programs", {}).items():
        for member in members:
            incoming.setdefault(name(program, member), []).append(member)
    for program, members in incoming.items():
        kept = [] if grown else [m for m in programs.get(program, []) if m not in members]
        programs[program] = sorted(kept + members, key=at)
    programs = dict(sorted(programs.items(), key=lambda item: min(map(at, item[1]), default=len(order))))
    names = [n for n in order if n in records] + [n for n in records if n not in order]
    merged = {**stored, **payload, "programs": programs, "members": [records[n] for n in names]}
    missing = [n for n in order if n not in records]
    merged.pop(MISSING, None)
    return {**merged, MISSING: missing} if missing else merged
