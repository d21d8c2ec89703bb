"""config.task_params: a task's parameters, {task: {param: value}}; a tuple value sweeps it.

Each (task, parameter values) is its own sampler in the program (a parameter may fix shapes),
and its own members: ``recall-pairs8-h4-s0`` for every parameter config.task_params sets, a
single value included (a task left at its defaults keeps its plain name, ``recall-h2-s0``; a
workdir trained when single values stayed out of names keeps those: Member.earlier). A member
of a task that declares parameters records them, defaults included, as ``task_params``
(results.json, HParams as ``task_params.<name>``).

Task parameters stay out of every PRNG key (init, dropout, data and held-out draws): members
that differ only in a task parameter start from the same init and see the same key stream (a
paired comparison), and a member draws what it draws without the others of the sweep (its
training equal to round-off across programs: docs/sweeps.md). So
members without parameters keep their names and keys, and every earlier config its numbers.
"""

from __future__ import annotations

import itertools
import math

import ml_collections

from mhjax.config import ConfigError
from mhjax.data.task_check import check_task
from mhjax.data.tasks import PARAM_TYPES, Task, get_task
from mhjax.experiments import sweep_skip
from mhjax.experiments.architecture import ordered_sweep
from mhjax.train.members import SHORT, Member, expand

FIELD = "config.task_params"


def declared(config) -> dict[str, dict]:
    """{task: {param: value or tuple of values}} of config.task_params, as plain Python."""
    raw = config.get("task_params", None)
    if raw is None:
        return {}
    if isinstance(raw, ml_collections.ConfigDict):
        raw = raw.to_dict()
    if not isinstance(raw, dict):
        raise ConfigError(f"{FIELD}: must be a dict {{task: {{parameter: value}}}}, got {raw!r}")
    return raw


def variants(config) -> dict[str, list[dict]]:
    """{task of config.sweep.task: its parameter values, one dict per variant}: the product of
    the swept values in declared order, ``[{}]`` for a task without config.task_params."""
    tasks = tuple(config.sweep.task)
    given = {name: params for name, params in declared(config).items() if name not in unused(config)}
    for name, params in given.items():
        if not isinstance(params, dict):
            raise ConfigError(f"{FIELD}.{name}: must be a dict {{parameter: value}}, got {params!r}")
    out = {}
    for name in tasks:
        params = given.get(name, {})
        task = get_task(name)
        axes = []
        for param, value in params.items():
            field = f"{FIELD}.{name}.{param}"
            if param not in task.params:
                raise ConfigError(
                    f"{field}: task {name!r} has no such parameter (its parameters: {', '.join(task.params) or 'none'})"
                )
            values = tuple(value) if isinstance(value, (tuple, list)) else (value,)
            if not values:
                raise ConfigError(f"{field}: an empty tuple sweeps nothing; give a value or a tuple of values")
            for v in values:
                if not isinstance(v, PARAM_TYPES):
                    raise ConfigError(f"{field}: each value must be a number, string, bool or None, got {v!r}")
                check_type(field, task.params[param], v)
            if len({repr(v) for v in values}) != len(values):
                raise ConfigError(f"{field}: repeated values {values!r}; each member must be distinct")
            axes.append([(param, v) for v in values])
        out[name] = [dict(combo) for combo in itertools.product(*axes)]
    return out


def unused(config) -> tuple[str, ...]:
    """Registered tasks that config.task_params sets but config.sweep.task leaves out: ignored, so
    one config runs any subset of its tasks (``notice`` names them). An unregistered name is a
    ConfigError."""
    tasks = tuple(config.sweep.task)
    names = tuple(name for name in declared(config) if name not in tasks)
    for name in names:
        get_task(name, f"{FIELD}.{name}")
    return names


def notice(config) -> list[str]:
    """The console line naming the ignored task_params entries (none: no line)."""
    names = unused(config)
    if not names:
        return []
    listed = ", ".join(map(str, config.sweep.task))
    return [f"{FIELD}: ignoring {', '.join(names)}, not in config.sweep.task ({listed})"]


# A parameter whose default has one of these types takes only values of it (an int for a float too).
TYPED = {bool: "a bool (True or False)", int: "an int", float: "a float (or an int)"}


def check_type(field: str, default, value) -> None:
    """ConfigError naming ``field``, the type expected and ``value`` when the default is an int,
    float or bool and ``value`` is of another type (bool is not an int here)."""
    kind = type(default)
    if kind not in TYPED:
        return
    ok = type(value) is kind or (kind is float and type(value) is int)
    if not ok:
        raise ConfigError(
            f"{field}: expected {TYPED[kind]} (the default is {default!r}), got {value!r} ({type(value).__name__})"
        )


def bound_tasks(config) -> list[Task]:
    """Every (task, parameter values) of the sweep, checked, in config order: a member's
    ``task_id`` indexes these. Without config.task_params: one per task, as before. A task that
    reads the config's data (text: config.data.path) is bound to it, its file checked there."""
    m = config.model
    out = []
    for name, values_list in variants(config).items():
        for values in values_list:
            bind = get_task(name).bind
            if bind is not None:
                out.append(bind(config).with_params(values))
            else:
                out.append(check_task(name, m.seq_len, m.vocab_size, params=values))
    return out


def task_index(tasks: list[Task], member: Member) -> int:
    """The index in ``bound_tasks`` of ``member``'s task and parameters."""
    want = (member["task"], member.hparams.get("task_params", {}))
    for i, t in enumerate(tasks):
        if (t.name, t.kwargs) == want:
            return i
    raise ConfigError(f"{FIELD}: no sampler for member {member.name}")  # cannot happen: members come from variants


def members(config) -> list[Member]:
    """The sweep's members: config.sweep's product, each member of a task with parameters in
    config.task_params repeated per value and named after every one of them (e.g.
    recall-pairs8-h4-s0, a single value included)."""
    base = expand(ordered_sweep(config), leading="task")  # architecture fields after the task
    base = sweep_skip.apply(config, base)  # grid points config.sweep_skip leaves out
    per_task = variants(config)
    out = []
    for member in base:
        name = member["task"]
        task = get_task(name)
        given = declared(config).get(name, {})
        swept = [p for p in given if len(_values(given[p])) > 1]
        for values in per_task[name]:
            if not task.params:
                out.append(member)
                continue
            hparams = {"task": name, "task_params": {**task.params, **values}}
            hparams.update({k: v for k, v in member.hparams.items() if k != "task"})
            rest = member.name[len(name) :]
            named, earlier = (name + _label(values, params) + rest for params in (given, swept))
            if _negative(values):  # named "k-1" before negative values were "kneg1"
                earlier = name + _label(values, given, text=_signed_text) + rest
            out.append(Member(named, hparams, earlier if earlier != named else None))
    names = [m.name for m in out]
    if len(set(names)) != len(names):
        raise ConfigError(
            f"{FIELD}: member names collide ({', '.join(sorted({n for n in names if names.count(n) > 1}))})"
        )
    return out


def _label(values: dict, params, text=None) -> str:
    text = text or _text
    return "".join(f"-{SHORT.get(p, p)}{text(values[p])}" for p in params)


def _values(value) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _is_negative(value) -> bool:
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    return numeric and math.copysign(1.0, value) < 0


def _negative(values: dict) -> bool:
    return any(_is_negative(v) for v in values.values())


def _text(value) -> str:
    """A parameter's value in a member name. A negative number is "neg" and its magnitude
    (``k=-1``: ``after_marker-kneg1-h4-s0``): names are fields joined by "-", so "k-1" would read
    as a field "k" and a field "1". Negatives are named, not refused: only the task knows whether
    one means something (an offset, a bias); its sampler refuses those it cannot take."""
    if _is_negative(value):
        return "neg" + _text(-value)
    return _signed_text(value)


def _signed_text(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
