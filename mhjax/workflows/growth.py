"""A sweep that grows: a config whose sweep holds a workdir's recorded members and more (every
other field equal) trains only the new members, beside the old ones.

The new members are a part of their own (io/parts.py): they checkpoint in W/grown/<n>/, the
recorded members' checkpoints, curves and results.json entries are left as they are, and
mhjax.json records the sweep's history (``sweep_history``: each part's folder, its sweep and its
members with their fields). Members are matched by their swept fields, never by name, so the
recorded members keep their recorded names even where the grown sweep would name them otherwise
(a field that now takes two values enters the new names). A member's PRNG keys derive from its
fields, so a new member equals itself trained alone.

Removing a member, changing the sweep's fields or any other field is refused in one line that
says what differs (a larger ``train.steps`` still trains every part longer: io/metadata.py)."""

from __future__ import annotations

import json
import os
from typing import NamedTuple

import ml_collections

from mhjax import __version__
from mhjax.config import ConfigError
from mhjax.experiments import make_experiment
from mhjax.io import parts
from mhjax.io.metadata import HISTORY, resolved, what
from mhjax.io.results import json_ready
from mhjax.io.workdir import Workdir
from mhjax.train import halving


class Part(NamedTuple):
    workdir: Workdir  # the part's view: its own checkpoints and snapshots
    experiment: object  # the sweep's experiment with this part's members only


def plan(experiment, workdir: Workdir, primary: bool = True, log=print) -> list[Part]:
    """The parts of ``experiment``'s sweep in ``workdir``, in training order; one part (the
    workdir itself) unless the sweep grew, now or before. A sweep that grows now is recorded
    in mhjax.json first (by the ``primary`` process), so a kill later resumes the same parts.
    The experiment's members take their recorded names."""
    if not os.path.isfile(workdir.metadata_path):
        return [Part(workdir, experiment)]
    metadata = workdir.metadata()
    stored, now = metadata.get("config", {}), json.loads(json.dumps(experiment.config.to_dict()))
    history = metadata.get(HISTORY)
    defaults = experiment.config_defaults  # a field given at its default equals it left out
    full_stored, full_now = resolved(stored, defaults), resolved(now, defaults)
    same_sweep = what(full_stored) == what(full_now)
    if metadata.get("mhjax_version") != __version__ or not _same_but_sweep(full_stored, full_now) or same_sweep:
        # resumed or trained longer, or a config the run refuses (io/metadata.check_or_write)
        return _parts(experiment, workdir, history) if history else [Part(workdir, experiment)]
    if halving.spec_of(experiment.config) or halving.read(workdir.path):
        raise ConfigError("config.sweep: a sweep with config.train.halving cannot grow (its rungs ranked the old grid)")
    history = history or _first_part(workdir, metadata)
    fresh = _new_members(experiment, workdir, stored.get("sweep", {}), now["sweep"], history)
    folder = parts.folder(len(history))
    history = [*history, {"folder": folder, "sweep": now["sweep"], "members": _fields(fresh)}]
    if primary:
        workdir.write_metadata({**metadata, "config": experiment.config.to_dict(), HISTORY: history})
    kept = sum(len(entry["members"]) for entry in history[:-1])
    log(
        f"the sweep grows: {len(fresh)} new member{'s' * (len(fresh) != 1)} ({', '.join(m.name for m in fresh)}) "
        f"train in {os.path.join(workdir.path, folder)}; the {kept} recorded ones stay as they are"
    )
    return _parts(experiment, workdir, history)


def grows(experiment, workdir: Workdir) -> bool:
    """Whether ``experiment`` would grow the sweep ``workdir`` holds: the same config but for added
    sweep values (``plan`` would add a part)."""
    if not os.path.isfile(workdir.metadata_path):
        return False
    metadata = workdir.metadata()
    stored, now = metadata.get("config", {}), json.loads(json.dumps(experiment.config.to_dict()))
    full_stored, full_now = resolved(stored, experiment.config_defaults), resolved(now, experiment.config_defaults)
    return _same_but_sweep(full_stored, full_now) and what(full_stored) != what(full_now)


def done(part: Part) -> bool:
    """Whether a part holds its last step and its members' results (nothing to train)."""
    latest, total = part.workdir.latest_step(), part.experiment.config.train.steps
    if latest is None or latest < total or not os.path.isfile(part.workdir.results_path):
        return False
    recorded = set(part.workdir.member_names())
    return all(m.name in recorded for m in part.experiment.members)


def adopt_names(experiment, metadata: dict) -> None:
    """The experiment's members take the names the sweep's history recorded (matched by fields)."""
    history = metadata.get(HISTORY)
    if history:
        experiment.rename(_recorded_names(experiment, history))


def _same_but_sweep(stored: dict, now: dict) -> bool:
    sweep = ("sweep", "sweep_skip")  # the members: compared by _new_members
    strip = lambda c: {k: v for k, v in what(c).items() if k not in sweep} if isinstance(c, dict) else c  # noqa: E731
    return strip(stored) == strip(now)


def _key(hparams: dict) -> str:
    return json.dumps(json_ready(hparams), sort_keys=True)


def _fields(members) -> dict:
    return {m.name: json_ready(m.hparams) for m in members}


def _recorded_names(experiment, history: list[dict]) -> dict[str, str]:
    """{member name now: the name the history recorded for a member of the same fields}."""
    recorded = {_key(h): name for entry in history for name, h in entry["members"].items()}
    names = {m.name: recorded.get(_key(m.hparams)) for m in experiment.members}
    return {now: then for now, then in names.items() if then is not None and then != now}


def _first_part(workdir: Workdir, metadata: dict) -> list[dict]:
    """The history of a sweep that has not grown before: its first run's members, made from its
    recorded config, with the names its run gave them."""
    try:
        recorded = make_experiment(ml_collections.ConfigDict(metadata["config"]))
    except (ConfigError, KeyError, TypeError) as exc:
        raise ConfigError(f"--workdir: {workdir.metadata_path}'s config cannot be read again ({exc})") from None
    recorded.keep_names(workdir.recorded_names())
    return [{"folder": "", "sweep": metadata["config"]["sweep"], "members": _fields(recorded.members)}]


def _new_members(experiment, workdir: Workdir, stored_sweep: dict, sweep: dict, history: list[dict]) -> list:
    """The members the grown sweep adds; a sweep that lost a member or changed its fields: a
    one-line ConfigError saying what differs."""
    if set(stored_sweep) != set(sweep):
        raise ConfigError(
            f"--workdir: {workdir.path} holds a sweep over {', '.join(sorted(stored_sweep))}; config.sweep is over "
            f"{', '.join(sorted(sweep))}: a sweep grows by values of the fields it has, use a new workdir"
        )
    now = {_key(m.hparams) for m in experiment.members}
    gone = [name for entry in history for name, h in entry["members"].items() if _key(h) not in now]
    if gone:
        raise ConfigError(
            f"--workdir: {workdir.path} holds {len(gone)} member{'s' * (len(gone) != 1)} config.sweep leaves out "
            f"({', '.join(gone[:4])}{', ...' if len(gone) > 4 else ''}); a sweep only grows: add values, or use a "
            "new workdir"
        )
    experiment.rename(_recorded_names(experiment, history))
    recorded = {_key(h) for entry in history for h in entry["members"].values()}
    fresh = [m for m in experiment.members if _key(m.hparams) not in recorded]
    taken = {name for entry in history for name in entry["members"]} & {m.name for m in fresh}
    if taken:  # a name already given to a member of other fields (one named before a field was swept)
        raise ConfigError(
            f"--workdir: {workdir.path} holds other members named {', '.join(sorted(taken))}; use a new workdir"
        )
    if not fresh:
        raise ConfigError(
            f"--workdir: config.sweep lists the same members as {workdir.path} in another order; "
            f"use its recorded sweep {json.dumps(stored_sweep)}"
        )
    return fresh


def _parts(experiment, workdir: Workdir, history: list[dict]) -> list[Part]:
    experiment.rename(_recorded_names(experiment, history))
    order = [m.name for m in experiment.members]
    out = []
    for entry in history:
        names = list(entry["members"])
        missing = [n for n in names if n not in order]
        if missing:  # a history the config does not hold (edited by hand): never train around it
            raise ConfigError(
                f"--workdir: {workdir.metadata_path} records members the config lacks: {', '.join(missing)}"
            )
        out.append(Part(workdir.part(entry["folder"], order), experiment.subset(names)))
    return out
