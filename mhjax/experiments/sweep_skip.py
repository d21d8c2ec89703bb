"""``config.sweep_skip``: grid points of ``config.sweep`` that are not trained.

A sweep is the product of its fields' values; some points of it repeat others (at heads 4 and
width 64 a fixed head size of 16 is the parameter-matched model) or are not wanted. Each entry
of ``sweep_skip`` names swept fields and one value of each, as a dict (``{"head_dim": 16,
"heads": 4}``) or a string (``"head_dim=16,heads=4"``, for ``--config.sweep_skip``); a member
whose fields hold every value of an entry is left out. Names stay those of the whole grid (a
skipped point frees no name and renames nobody), so a sweep that later trains a skipped point
grows by it (workflows/growth.py). Bad entries are one line each (config.ConfigError)."""

from __future__ import annotations

from mhjax.config import ConfigError

FIELD = "config.sweep_skip"


def entries(config) -> list[dict]:
    """The entries as {field: swept value}, checked against config.sweep; [] without the field."""
    skip = config.get("sweep_skip")
    if skip is None:
        return []
    if isinstance(skip, (str, dict)) or not hasattr(skip, "__iter__"):
        skip = (skip,)
    sweep = {f: tuple(v) if isinstance(v, (tuple, list)) else (v,) for f, v in dict(config.sweep).items()}
    return [_entry(i, entry, sweep) for i, entry in enumerate(skip)]


def apply(config, members: list) -> list:
    """``members`` without those an entry matches; an entry that matches none, or a skip that
    leaves none, is an error."""
    wanted = entries(config)
    if not wanted:
        return members
    for i, entry in enumerate(wanted):
        if not any(_matches(m, entry) for m in members):
            raise ConfigError(f"{FIELD}[{i}]: {_text(entry)} matches no member of config.sweep")
    kept = [m for m in members if not any(_matches(m, entry) for entry in wanted)]
    if not kept:
        raise ConfigError(f"{FIELD}: leaves no member of config.sweep to train")
    return kept


def _matches(member, entry: dict) -> bool:
    return all(_same(member.hparams.get(f), v) for f, v in entry.items())


def _same(a, b) -> bool:
    return type(a) is type(b) and a == b  # 1 is not 1.0 nor True: a swept value exactly


def _entry(i: int, entry, sweep: dict) -> dict:
    where = f"{FIELD}[{i}]"
    if isinstance(entry, str):
        pairs = [part.split("=", 1) for part in entry.replace(" ", "").split(",") if part]
        if not pairs or any(len(p) != 2 for p in pairs):
            raise ConfigError(f"{where}: {entry!r} is not 'field=value[,field=value...]' (e.g. 'head_dim=16,heads=4')")
    elif hasattr(entry, "items"):
        pairs = list(entry.items())
    else:
        raise ConfigError(f"{where}: a dict of swept fields and values or a 'field=value,...' string; got {entry!r}")
    if not pairs:
        raise ConfigError(f"{where}: empty: name at least one swept field and its value")
    out = {}
    for field, value in pairs:
        if field not in sweep:
            raise ConfigError(f"{where}: {field!r} is not a field of config.sweep ({', '.join(sweep)})")
        out[field] = _swept_value(f"{where}.{field}", value, sweep[field])
    return out


def _swept_value(where: str, value, values: tuple):
    """The swept value ``value`` names (itself, or its text for a string entry)."""
    for v in values:
        if _same(v, value) or (isinstance(value, str) and not isinstance(v, str) and _text_of(v) == value):
            return v
        if isinstance(value, str) and isinstance(v, (int, float)) and not isinstance(v, bool):
            try:
                if float(value) == v:
                    return v
            except ValueError:
                pass
    raise ConfigError(f"{where}: {value!r} is not one of its swept values {values!r}")


def _text_of(value) -> str:
    return "None" if value is None else str(value)


def _text(entry: dict) -> str:
    return ",".join(f"{f}={_text_of(v)}" for f, v in entry.items())
