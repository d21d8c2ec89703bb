"""Where a sweep is (``mhjax status --workdir W``, ``mhjax.load(W).status()``), read while
another command may hold the workdir: this module only reads (the lock file, W/progress.json,
the checkpoint folders' names, times and metadata, results.json, mhjax.json).

Each member's state:

* ``training``: the process holding the workdir's lock is the run that writes its progress;
* ``done``: results.json holds it at the configured number of steps, status ok;
* ``diverged``: results.json says so, or the progress of its run (training or stopped) does;
* ``stopped``: a checkpoint holds it, below the configured steps, and no run trains it now
  (stopped by a signal or Ctrl-C, killed, or the job ended): the same command resumes it;
* ``missing``: nothing holds it yet (a run that has not written its first checkpoint).

These are run states: results.json's ``status`` stays ok/diverged, the member's numbers.
"""

from __future__ import annotations

import os
import time

from mhjax.io import parts, progress
from mhjax.io.checkpoint import member_key, stored_member_keys
from mhjax.io.lock import holder_pid
from mhjax.io.workdir import Workdir

STATES = ("training", "done", "diverged", "stopped", "missing")


def sweep_status(workdir) -> dict:
    """{"workdir", "holder_pid", "total_steps", "members": [row, ...]}; a row: name, part, state,
    step (reached: the run's progress while it trains, else its latest checkpoint's), checkpoint_step,
    checkpoint_age_s, member_steps_per_s (its run's, over the run so far), eta_s (time to finish at
    that rate; 0 when done)."""
    wd = Workdir.of(workdir)
    total = int(wd.config()["train"]["steps"])
    holder = holder_pid(wd)
    finished = _finished(wd, total)
    rows, now = {}, time.time()
    for folder in wd.part_folders():
        view = wd.part(folder, []) if folder else wd
        run = progress.read(view)
        live = run is not None and holder is not None and run.get("pid") == holder
        steps = parts.steps_in(view.checkpoints_dir)
        saved = steps[-1] if steps else None
        held = _checkpoint_members(view, saved)  # checkpoint keys (io/checkpoint.member_key)
        age = now - os.path.getmtime(os.path.join(view.checkpoints_dir, str(saved))) if saved is not None else None
        rate = run.get("member_steps_per_s") if run else None
        names = (run or {}).get("members", [])
        names = names + [k for k in held if k not in {member_key(n) for n in names}]
        for name in names:
            kept = member_key(name) in held
            step = run["step"] if live else saved if kept else None
            rows[name] = {
                "name": name,
                "part": folder,
                "state": _state(name, live, kept, run),
                "step": step,
                "checkpoint_step": saved if kept else None,
                "checkpoint_age_s": age if kept else None,
                "member_steps_per_s": rate,
                "eta_s": _eta(step, total, rate, len(names)),
            }
    for name, record in finished.items():  # results.json's word on a finished member is the last
        row = rows.setdefault(name, {"name": name, "part": "", "checkpoint_step": None, "checkpoint_age_s": None})
        row.update(state=record, step=total, eta_s=0.0)
        row.setdefault("member_steps_per_s", None)
    return {"workdir": wd.path, "holder_pid": holder, "total_steps": total, "members": list(rows.values())}


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
    return {m["name"]: "diverged" if m.get("status") == "diverged" else "done" for m in results["members"]}


def _checkpoint_members(view: Workdir, step: int | None) -> list[str]:
    if step is None:
        return []
    return stored_member_keys(view.checkpoints_dir, step)
