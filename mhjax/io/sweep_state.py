"""Where a sweep is (``mhjax status --workdir W``, ``mhjax.load(W).status()``), read while
another command may hold the workdir: this module only reads (the lock files, each part's
progress.json, the checkpoint folders' names, times and metadata, results.json, mhjax.json).

Each member's state:

* ``training``: the process holding its lock trains it: the workdir's lock (W/.mhjax.lock) held by
  the run that writes the part's progress, or, of a sweep in shards (``--shard I/N``), its shard's
  lock (W/shards/<I>/.mhjax.lock), which only the process training that shard holds;
* ``starting``: the process holding its lock has started a run that trains it and is restoring
  and compiling: no chunk since its start (its progress.json says ``"phase": "starting"``), so
  the step shown is its latest checkpoint's;
* ``done``: results.json holds it at the configured number of steps, status ok;
* ``diverged``: results.json says so, or the progress of its run (training or stopped) does;
* ``stopped``: a checkpoint holds it, below the configured steps, and no run trains it now
  (stopped by a signal or Ctrl-C, killed, or the job ended): the same command resumes it;
* ``stopped_by_halving``: a rung of config.train.halving stopped it (W/halving.json, train/halving.py):
  its step is the rung's, and nothing is left to train;
* ``missing``: nothing holds it yet (a run that has not written its first checkpoint, a shard
  not started: its members are read from mhjax.json's sweep_history).

A shard's row takes its members' word: ``done`` when every member is done or diverged, else
``training`` while held, ``stopped`` when a checkpoint holds it, else ``missing``.

These are run states: results.json's ``status`` stays ok/diverged, the member's numbers.
"""

from __future__ import annotations

import os
import time

from mhjax.io import halved, parts, progress
from mhjax.io.checkpoint_names import member_key, stored_member_keys
from mhjax.io.lock import holder_pid
from mhjax.io.metadata import HISTORY
from mhjax.io.workdir import Workdir

STATES = ("starting", "training", "done", "diverged", "stopped", "stopped_by_halving", "missing")
HALVED = "stopped_by_halving"
STARTING = "starting (restoring/compiling)"  # what the table's top line says of a run in that state


def sweep_status(workdir) -> dict:
    """{"workdir", "holder_pid", "total_steps", "members": [row, ...], "shards": [shard row, ...]};
    a member's row: name, part, state, step (reached: the run's progress while it trains, else its
    latest checkpoint's), checkpoint_step, checkpoint_age_s, member_steps_per_s (its run's, over the
    run so far), eta_s (time to finish at that rate; 0 when done). A shard's row (a sweep trained
    with ``--shard I/N``; [] otherwise): shard ("I/N"), folder, state, step, holder_pid, members, eta_s."""
    wd = Workdir.of(workdir)
    total = int(wd.config()["train"]["steps"])
    holder = holder_pid(wd)
    finished = _finished(wd, total)
    rows, shards, now = {}, [], time.time()
    for folder, recorded, shard in _parts(wd):
        view = wd.part(folder, []) if folder else wd
        run = progress.read(view)
        part_holder = holder_pid(wd, wd.shard_lock_path(int(shard.split("/")[0]))) if shard else holder
        # a shard's lock is held only by the process training it; the workdir's also by analyze/report
        live = part_holder is not None and (shard is not None or (run is not None and run.get("pid") == part_holder))
        current = run is not None and part_holder is not None and run.get("pid") == part_holder
        starting = current and run.get("phase") == "starting"
        steps = parts.steps_in(view.checkpoints_dir)
        saved = steps[-1] if steps else None
        held = _checkpoint_members(view, saved)  # checkpoint keys (io/checkpoint.member_key)
        age = now - os.path.getmtime(os.path.join(view.checkpoints_dir, str(saved))) if saved is not None else None
        rate = run.get("member_steps_per_s") if run else None
        names = list(recorded)
        for name in (run or {}).get("members", []) + held:
            if member_key(name) not in {member_key(n) for n in names}:
                names.append(name)
        for name in names:
            kept = member_key(name) in held
            step = run["step"] if current else saved if kept else None
            rows[name] = {
                "name": name,
                "part": folder,
                "state": "starting" if starting and name in run.get("members", []) else _state(name, live, kept, run),
                "step": step,
                "checkpoint_step": saved if kept else None,
                "checkpoint_age_s": age if kept else None,
                "member_steps_per_s": rate,
                "eta_s": _eta(step, total, rate, len(names)),
            }
        if shard is not None:
            shards.append({"shard": shard, "folder": folder, "holder_pid": part_holder, "members": names})
    for name, rung in _halved(wd).items():  # a rung's word: nothing more to train
        row = rows.setdefault(name, {"name": name, "part": "", "checkpoint_step": None, "checkpoint_age_s": None})
        row.update(state=HALVED, step=rung, eta_s=0.0)
        row.setdefault("member_steps_per_s", None)
    for name, record in finished.items():  # results.json's word on a finished member is the last
        row = rows.setdefault(name, {"name": name, "part": "", "checkpoint_step": None, "checkpoint_age_s": None})
        row.update(state=record, step=row.get("step") if record == HALVED else total, eta_s=0.0)
        row.setdefault("member_steps_per_s", None)
    for shard in shards:
        shard.update(_shard_state([rows[n] for n in shard["members"]], shard["holder_pid"]))
    return {
        "workdir": wd.path,
        "holder_pid": holder,
        "total_steps": total,
        "members": list(rows.values()),
        "shards": shards,
    }


def _parts(wd: Workdir) -> list[tuple[str, list[str], str | None]]:
    """(folder, member names mhjax.json records for it, its shard "I/N" or None) of each part."""
    folders = wd.part_folders()  # a history that is not a list of parts: its one-line ConfigError
    history = wd.metadata().get(HISTORY) if os.path.isfile(wd.metadata_path) else None
    if not isinstance(history, list) or len(history) != len(folders):
        return [(folder, [], None) for folder in folders]
    out = []
    for entry in history:
        members = entry.get("members")
        shard = entry.get("shard") if isinstance(entry.get("shard"), str) else None
        out.append((entry["folder"], list(members) if isinstance(members, dict) else [], shard))
    return out


def _shard_state(members: list[dict], holder: int | None) -> dict:
    """A shard's state, step and time to finish from its members' rows."""
    if members and all(m["state"] in ("done", "diverged", HALVED) for m in members):
        state = "done"
    elif any(m["state"] == "starting" for m in members):
        state = "starting"
    elif holder is not None:
        state = "training"
    else:
        state = "stopped" if any(m["checkpoint_step"] is not None for m in members) else "missing"
    steps = [m["step"] for m in members if m["step"] is not None and m["state"] not in ("done", "diverged")]
    etas = [m["eta_s"] for m in members if m["eta_s"] is not None]
    done = state == "done" or not members
    return {
        "state": state,
        "step": max(m["step"] or 0 for m in members) if done and members else min(steps) if steps else None,
        "eta_s": 0.0 if done else max(etas) if etas and len(etas) == len(members) else None,
    }


def _state(name: str, live: bool, held: bool, run: dict | None) -> str:
    if run is not None and name in run.get("diverged", []) and (live or held):
        return "diverged"
    return "training" if live else "stopped" if held else "missing"


def _eta(step, total: int, rate, members: int) -> float | None:
    """Seconds to ``total`` at ``rate`` member-steps/s over ``members`` members (None: unknown)."""
    if step is None or not rate:
        return None
    return max(total - int(step), 0) * members / rate


def _finished(wd: Workdir, total: int) -> dict:
    """{member: "done" or "diverged"} of results.json when it is at ``total`` steps."""
    if not os.path.isfile(wd.results_path):
        return {}
    try:
        results = wd.results()
    except Exception:  # being rewritten by the run that holds the workdir: read next time
        return {}
    if int(results.get("steps") or 0) < total:
        return {}
    return {
        m["name"]: m.get("status") if m.get("status") in ("diverged", HALVED) else "done" for m in results["members"]
    }


def _halved(wd: Workdir) -> dict:
    """{member: its rung's step} of the members halving stopped ({} without halving)."""
    return halved.stopped_steps(wd.path)


def _checkpoint_members(view: Workdir, step: int | None) -> list[str]:
    if step is None:
        return []
    return stored_member_keys(view.checkpoints_dir, step)
