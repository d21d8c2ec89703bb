"""Successive halving inside the program: ``config.train.halving``.

``halving = dict(rungs=(s1, s2, ...), keep=1/3)`` or, as Ray Tune's ASHA scheduler names it,
``dict(rungs=..., reduction_factor=3)`` (keep = 1 / reduction_factor; Ray's ``grace_period`` is
the first rung, ``max_t`` is train.steps). At each rung step, within each comparison group and
head count (analysis/comparisons.cells: the groups of ``compare.tune``), the settings of the tuned
axes are ranked by mean validation loss over their seeds; the best floor(n * keep) of the n
settings (at least one) train on, a setting kept or stopped with all its seeds. A setting with a
diverged member (or a non-finite validation loss) stops at the first rung regardless.

Rungs must be multiples of train.chunk_steps (the loop decides between chunks; a rung inside a
chunk is refused, not moved). At a rung: the members are evaluated, the stopped members' states
are saved in W/halving/<step> (an orbax step folder, kept) and their results.json entries in
W/halving.json with the decision; then the sweep is laid out again over the survivors alone
(Experiment.subset, a new Sweep: recompiled programs with fewer members) and the rung's regular
checkpoint holds the survivors. A run resumed from a checkpoint at or after a rung trains the
survivors recorded there; one resumed before a recorded rung takes the recorded decision when it
reaches it again, never a new one."""

from __future__ import annotations

import json
import math
import os

import jax
import numpy as np

from mhjax.analysis.comparisons import STOPPED, cells, group_fields, tuned_axes
from mhjax.config import ConfigError
from mhjax.io import window_files
from mhjax.io.checkpoint import SweepCheckpointer, member_key
from mhjax.io.halved import HALVING_FILE, HALVING_FOLDER
from mhjax.io.results import json_ready
from mhjax.train.payload import results_payload

FILE = HALVING_FILE  # W/halving.json: the rungs decided so far (mhjax status reads it)
FOLDER = HALVING_FOLDER  # W/halving/<step>/: the states of the members stopped at that rung
DEFAULT_KEEP = 1 / 3


def spec_of(config) -> dict | None:
    """{"rungs": (s, ...), "keep": fraction} from config.train.halving, None when off; a bad value:
    a ConfigError naming the field and what is allowed."""
    raw = config.train.get("halving") if "train" in config else None
    if raw is None:
        return None
    raw = dict(raw) if hasattr(raw, "keys") else raw
    if not isinstance(raw, dict):
        raise ConfigError(f"config.train.halving: a dict(rungs=(steps, ...), keep=fraction), got {raw!r}")
    unknown = set(raw) - {"rungs", "keep", "reduction_factor"}
    if unknown:
        raise ConfigError(
            f"config.train.halving: unknown field {sorted(unknown)[0]!r} (allowed: rungs, keep, reduction_factor)"
        )
    steps, chunk = int(config.train.steps), int(config.train.chunk_steps)
    rungs = raw.get("rungs")
    if isinstance(rungs, int) and not isinstance(rungs, bool):
        rungs = (rungs,)
    if not isinstance(rungs, (tuple, list)) or not rungs:
        raise ConfigError(f"config.train.halving.rungs: a non-empty tuple of steps, got {rungs!r}")
    for r in rungs:
        if isinstance(r, bool) or not isinstance(r, int) or not 0 < r < steps or r % chunk:
            raise ConfigError(
                f"config.train.halving.rungs: each a multiple of train.chunk_steps ({chunk}) in (0, train.steps = "
                f"{steps}); got {r!r}"
            )
    if list(rungs) != sorted(set(rungs)):
        raise ConfigError(f"config.train.halving.rungs: strictly increasing steps; got {tuple(rungs)!r}")
    if "keep" in raw and "reduction_factor" in raw:
        raise ConfigError("config.train.halving: keep or reduction_factor (keep = 1 / reduction_factor), not both")
    if "reduction_factor" in raw:
        factor = raw["reduction_factor"]
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 1:
            raise ConfigError(f"config.train.halving.reduction_factor: a number > 1, got {factor!r}")
        keep = 1.0 / factor
    else:
        keep = raw.get("keep", DEFAULT_KEEP)
        if isinstance(keep, bool) or not isinstance(keep, (int, float)) or not 0 < keep < 1:
            raise ConfigError(f"config.train.halving.keep: a fraction in (0, 1), got {keep!r}")
    if not tuned_axes(config):
        raise ConfigError(
            "config.train.halving: needs config.compare.tune (the axes whose settings compete, e.g. ('learning_rate',))"
        )
    return {"rungs": [int(r) for r in rungs], "keep": float(keep)}


def kept_count(n: int, keep: float) -> int:
    """How many of ``n`` settings go on: floor(n * keep), at least one (1e-9: 3 * (1/3) is 3 * 0.333..)."""
    return max(1, math.floor(n * keep + 1e-9))


def decide(records: list[dict], fields, tuned, keep: float) -> dict:
    """The rung's decision from the members' results entries at the rung (``fields``: the swept
    ones): {"kept": [name, ...], "stopped": {name: reason}, "val_loss": {name: at the rung}}."""
    kept, stopped = [], {}
    for by_heads in cells(records, group_fields(fields, tuned), tuned, _value).values():
        for heads, settings in by_heads.items():
            scores, bad = {}, []
            for setting, indices in settings.items():
                values = [records[i].get("val_loss") for i in indices]
                ok = all(v is not None and math.isfinite(v) for v in values)
                if ok and all(records[i].get("status", "ok") != "diverged" for i in indices):
                    scores[setting] = sum(values) / len(values)
                else:
                    bad.append(setting)
            ranked = sorted(sorted(scores, key=str), key=scores.__getitem__)
            n = kept_count(len(settings), keep)
            for rank, setting in enumerate(ranked):
                label = ", ".join(f"{a}={v}" for a, v in zip(tuned, setting))
                for i in settings[setting]:
                    if rank < n:
                        kept.append(records[i]["name"])
                    else:
                        stopped[records[i]["name"]] = (
                            f"{label}: mean val_loss {scores[setting]:.4f} ranked {rank + 1} of {len(settings)} "
                            f"(keeps {n}) at heads {heads}"
                        )
            for setting in bad:
                label = ", ".join(f"{a}={v}" for a, v in zip(tuned, setting))
                for i in settings[setting]:
                    stopped[records[i]["name"]] = f"{label}: diverged or unscored at heads {heads}"
    order = [m["name"] for m in records]
    return {
        "kept": [n for n in order if n in kept],
        "stopped": {n: stopped[n] for n in order if n in stopped},
        "val_loss": {m["name"]: m.get("val_loss") for m in records},  # what was ranked, every member's
    }


def _value(member, field):
    """A member's value of ``field``, hashable (a dict, e.g. task_params: its JSON text)."""
    value = member.get(field) if isinstance(member, dict) else member.hparams.get(field)
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value


def predicted(experiment) -> list[tuple[int, list[str]]]:
    """[(from step, the members training from it)]: the whole grid from 0, then after each rung as
    many settings per comparison group and head count as keep leaves (the first ones standing in for
    the ones validation will pick: the same count, not the same names), none diverging."""
    spec = spec_of(experiment.config)
    tuned = tuned_axes(experiment.config)
    fields = group_fields(list(experiment.config.sweep.keys()), tuned)
    members = experiment.members
    left = {}  # (group, heads) -> the settings still training, in sorted order
    for group, by_heads in cells(members, fields, tuned, _value).items():
        for heads, settings in by_heads.items():
            left[(group, heads)] = {s: settings[s] for s in sorted(settings, key=str)}
    out = [(0, [m.name for m in members])]
    for rung in spec["rungs"]:
        left = {k: dict(list(v.items())[: kept_count(len(v), spec["keep"])]) for k, v in left.items()}
        names = {members[i].name for v in left.values() for idx in v.values() for i in idx}
        out.append((rung, [m.name for m in members if m.name in names]))
    return out


def describe(experiment, backend: str) -> list[str]:
    """--dry-run's lines of a halved sweep: its rungs, the predicted member-steps and the programs
    compiled after each rung (one set per surviving shape); none without halving."""
    spec = spec_of(experiment.config)
    if not spec:
        return []
    total = int(experiment.config.train.steps)
    segments = predicted(experiment)
    ends = [start for start, _ in segments[1:]] + [total]
    steps = sum((end - start) * len(names) for (start, names), end in zip(segments, ends))
    full = total * len(experiment.members)
    lines = [
        f"halving: rungs at steps {', '.join(map(str, spec['rungs']))}, keep {spec['keep']:.3g} per comparison group "
        f"and head count: predicted {steps:,} member-steps of the full grid's {full:,} ({steps / full:.0%})"
    ]
    for start, names in segments[1:]:
        programs = experiment.subset(names).plan(backend).programs
        lines.append(
            f"  after step {start}: {len(names)} members in {len(programs)} program(s), compiled then: "
            + ", ".join(f"{p.name} ({len(p.members)} members)" for p in programs)
        )
    return lines


class Halving:
    """The halving of one run (train/loop.py); a no-op when config.train.halving is unset."""

    def __init__(self, experiment, workdir, log=print):
        self.full, self.workdir, self.log = experiment, workdir, log
        self.spec = spec_of(experiment.config)
        self.tuned = tuned_axes(experiment.config)
        self.path = os.path.join(workdir.path, FILE)
        self.decisions = read(workdir.path).get("decisions", []) if self.spec else []
        self.ended = False
        self.reported = set()  # the loop's (member index, event) pairs said (train/status.py), renumbered at a rung

    def experiment_at(self, step: int):
        """The experiment over the members that train after ``step`` (its decisions up to it)."""
        stopped = {n for d in self.decisions if d["step"] <= step for n in d["stopped"]}
        return self.full.subset([m.name for m in self.full.members if m.name not in stopped]) if stopped else self.full

    def due(self, step: int) -> bool:
        return bool(self.spec) and step in self.spec["rungs"]

    def rung(self, sweep, states, evaluation, seconds, step: int, make_sweep, recompile):
        """Decide the rung at ``step`` (or take its recorded decision), save the stopped members,
        and return (sweep, states, evaluation) over the survivors (``make_sweep(experiment)``,
        compiled by ``recompile(sweep)``)."""
        experiment = sweep.experiment
        decision = next((d for d in self.decisions if d["step"] == step), None)
        if decision is None:
            payload = results_payload(experiment, sweep, states, evaluation, seconds, step, resumed_from=None)
            decision = {
                "step": step,
                **decide(payload["members"], self.workdir.sweep_fields(), self.tuned, self.spec["keep"]),
            }
            entries = {m["name"]: m for m in payload["members"] if m["name"] in decision["stopped"]}
            for name, entry in entries.items():
                entry.update(status=STOPPED, stopped_at_step=step, stopped_reason=decision["stopped"][name])
            decision["entries"] = entries
            member_states = sweep.member_states(states)
            if decision["stopped"]:
                saver = SweepCheckpointer(os.path.join(self.workdir.path, FOLDER), keep=len(self.spec["rungs"]) + 1)
                try:
                    saver.save(step, {"members": {member_key(n): member_states[n] for n in decision["stopped"]}})
                finally:
                    saver.close()
            self.decisions.append(decision)
            self._write()
        else:
            member_states = sweep.member_states(states)
        for name, reason in decision["stopped"].items():
            self.log(f"halving at step {step}: {name} stopped ({reason})")
        kept = decision["kept"]
        self.log(f"halving at step {step}: {len(kept)} of {len(experiment.members)} members train on")
        self.ended = not kept  # every member stopped: the run ends here, reported from this sweep
        if not decision["stopped"] or self.ended:
            return sweep, states, evaluation
        old = {m.name: i for i, m in enumerate(experiment.members)}
        was = [m.name for m in experiment.members]
        new = make_sweep(self.full.subset(kept))
        new.records.load_json(sweep.records.to_json(), 0)
        new.records.starts_at = sweep.records.starts_at
        new.path_from = getattr(sweep, "path_from", 0)
        states = new.stack_members({n: member_states[n] for n in kept})
        evaluation = {j: evaluation[old[m.name]] for j, m in enumerate(new.experiment.members)} if evaluation else None
        index = {m.name: j for j, m in enumerate(new.experiment.members)}
        renumbered = {(index[was[i]], e) for i, e in self.reported if was[i] in index}
        self.reported.clear()  # the loop's own set, in the survivors' indices
        self.reported.update(renumbered)
        for name in decision["stopped"]:  # their seconds are in their entries; checkpoints hold the survivors'
            seconds.pop(name, None)
        recompile(new)
        return new, states, evaluation

    def member_steps_between(self, start: int, end: int) -> int:
        """Member-steps trained from step ``start`` to ``end`` (members stopped at a rung: up to it)."""
        stopped = {n: d["step"] for d in self.decisions for n in d["stopped"]}
        return sum(max(0, min(stopped.get(m.name, end), end) - start) for m in self.full.members)

    def member_steps(self, total: int) -> dict:
        return {
            "member_steps": self.member_steps_between(0, total),
            "full_grid_member_steps": total * len(self.full.members),
        }

    def finish(self, payload: dict, total: int) -> dict:
        """results.json's payload with the stopped members' entries (in the sweep's order) and ``halving``."""
        if not self.spec:
            return payload
        entries = {n: dict(e) for d in self.decisions for n, e in d["entries"].items()}
        for entry in entries.values():
            for field in (window_files.FIELD, window_files.VALIDATION_FIELD):
                if entry.get(field) is not None:
                    entry[field] = np.asarray(entry[field], dtype=np.float64)
        trained = {m["name"]: m for m in payload["members"]}
        payload["members"] = [entries.get(m.name) or trained[m.name] for m in self.full.members]
        self.log(self.end_line(total))
        payload["halving"] = {
            **self.spec,
            **self.member_steps(total),
            "stopped": {n: d["step"] for d in self.decisions for n in d["stopped"]},
        }
        return payload

    def since_text(self, member_steps: int) -> str:
        """The loop's "trained ..." line's note of a run whose member axis shrank ("" without halving)."""
        return f" (after its rungs; {member_steps:,} member-steps)" if self.decisions else ""

    def end_line(self, total: int) -> str | None:
        if not self.spec:
            return None
        counts = self.member_steps(total)
        run, full = counts["member_steps"], counts["full_grid_member_steps"]
        return f"halving: {run:,} member-steps trained against the full grid's {full:,} ({run / full:.0%})"

    def _write(self) -> None:
        if jax.process_index() != 0:  # one writer; every process holds the same decision (a collective payload)
            return
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            # per-window sums (arrays) as lists: back to arrays in ``finish``
            json.dump(json_ready({**self.spec, "decisions": self.decisions}), f, default=np.ndarray.tolist)
        os.replace(tmp, self.path)


def read(workdir_path: str) -> dict:
    """W/halving.json ({} when absent)."""
    path = os.path.join(workdir_path, FILE)
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)
