"""Head counts compared, each at its best: ``config.compare.tune`` and results.json's ``comparisons``.

Groups (``cells``): the members of one task and one value of every swept field but ``heads``,
``seed`` and the tuned axes form a comparison group; within it, per head count, each setting of
the tuned axes is a cell holding one member per seed. ``select`` picks per group and head count
the setting with the lowest mean validation loss over its seeds (a setting with a diverged or
unscored seed is never picked). Head counts are then compared on the test set at their selected
settings, paired by seed and window with the smallest head count (analysis/paired.compare).
Without ``compare.tune`` every setting is a group of its own (the table at each swept value).

An entry (``comparisons``): ``group`` ({field: value}), ``heads``, ``selected`` ({axis: value}),
``val_loss`` (mean over seeds at the selection), ``test_loss`` (mean over seeds, nats), its
``test_loss_se``, ``difference`` (to the smallest head count, paired, nats),
``difference_interval`` ([low, high], 95 %), ``per_seed_differences``, ``verdict``, ``seeds``
(paired seeds), ``clusters`` (of windows, where the windows are shared), ``note`` (why a
verdict may mean little, "" when none) and, under halving (train/halving.py), ``stopped_by_halving``:
the members stopped at a rung, never selected."""

from __future__ import annotations

import json
import math
from collections import defaultdict

import numpy as np

from mhjax.analysis import paired
from mhjax.config import ConfigError

OLD = "no validation set (written before validation sets existed)"
STOPPED = "stopped_by_halving"  # a member's status: stopped at a rung (train/halving.py), never selected
FIXED = ("heads", "seed", "task")  # never tuned: what is compared, what is averaged, what is asked


def tuned_axes(config) -> tuple[str, ...]:
    """config.compare.tune (default: none); ``config``: a ConfigDict or the plain dict of mhjax.json."""
    compare = config.get("compare") or {}
    return tuple(compare.get("tune", ()) or ())


def check_tune(config) -> None:
    """A tuned axis is a swept field with two values or more, other than FIXED: else one line."""
    compare = config.get("compare") or {}
    tune = compare.get("tune", ()) if hasattr(compare, "get") else compare
    if isinstance(tune, str) or not isinstance(tune, (tuple, list)):
        raise ConfigError(f"config.compare.tune: a tuple of swept fields, e.g. ('learning_rate',), got {tune!r}")
    swept = {k: tuple(v) if isinstance(v, (tuple, list)) else v for k, v in dict(config.sweep).items()}
    multi = [f for f, v in swept.items() if f not in FIXED and isinstance(v, tuple) and len(v) > 1]
    allowed = f"swept fields with two values or more, not heads, seed or task: {', '.join(multi) or 'none here'}"
    for axis in tune:
        if axis in FIXED:
            raise ConfigError(f"config.compare.tune: {axis!r} cannot be tuned; allowed: {allowed}")
        if not isinstance(swept.get(axis), tuple):
            raise ConfigError(f"config.compare.tune: {axis!r} is not swept (config.sweep); allowed: {allowed}")
        if len(swept[axis]) < 2:
            raise ConfigError(
                f"config.compare.tune: {axis!r} has one value ({swept[axis][0]!r}): nothing to pick; allowed: {allowed}"
            )


def group_fields(fields, tuned=()) -> tuple[str, ...]:
    """The fields that make a comparison group: ``fields`` (the swept ones) less heads, seed and ``tuned``."""
    return tuple(f for f in fields if f not in ("heads", "seed", *tuned))


class _Frozen(dict):
    """A dict field value (e.g. ``task_params``) as a group or setting key: hashed by its JSON."""

    def __hash__(self):
        return hash(json.dumps(self, sort_keys=True, default=str))


def _get(member, field):
    value = member.get(field) if isinstance(member, dict) else member[field]
    return _Frozen(value) if isinstance(value, dict) else tuple(value) if isinstance(value, list) else value


def cells(members, fields, tuned=(), value=_get) -> dict:
    """{group: {heads: {setting: [member index, ...]}}}: group, a tuple of ``fields``' values (the
    comparison group: group_fields), setting a tuple of the ``tuned`` axes' values; ``value(member,
    field)`` reads a member's value (results.json records or train/members.Member)."""
    out: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for i, m in enumerate(members):
        group = tuple(value(m, f) for f in fields)
        out[group][value(m, "heads")][tuple(value(m, a) for a in tuned)].append(i)
    return out


def select(settings: dict, score) -> tuple | None:
    """The setting (a key of ``settings``: {setting: [member index]}) with the lowest mean
    ``score(index)`` over its members; None where every setting has an unscored member (score
    None or not finite). Ties: the first in sorted order."""
    means = {}
    for setting, indices in settings.items():
        values = [score(i) for i in indices]
        if values and all(v is not None and math.isfinite(v) for v in values):
            means[setting] = float(np.mean(values))
    if not means:
        return None
    return min(sorted(means, key=str), key=means.__getitem__)


def _edge_notes(tuned, setting, grid) -> list[str]:
    notes = []
    for axis, value, values in zip(tuned, setting, grid):
        ordered = sorted(values)
        if len(ordered) > 1 and value == ordered[0]:
            notes.append(f"lowest {axis} tried: widen the grid")
        elif len(ordered) > 1 and value == ordered[-1]:
            notes.append(f"highest {axis} tried: widen the grid")
    return notes


def baseline_note(test_losses: dict, baseline: dict | None, accuracies=(), vocab: int | None = None) -> str:
    """The group's note where its comparison can mean little: members (``test_losses``: {heads:
    nats}) not below the strongest n-gram baseline (text), or held-out accuracy (``accuracies``)
    within twice chance (1 / vocab) for a generated task; "" otherwise."""
    if baseline:
        unit = baseline.get("unit", "bits/byte")
        names = [n for n in ("unigram", "bigram", "trigram") if baseline.get(f"{n}_bits") is not None]
        if names:
            best = min(names, key=lambda n: baseline[f"{n}_bits"])
            bits = baseline[f"{best}_bits"]
            above = [h for h, loss in test_losses.items() if loss / math.log(2) >= bits]
            if above:
                return (
                    f"members above the {best} ({bits:.2f} {unit}): differences may reflect how fast each "
                    "learns, not what it can represent"
                )
        return ""
    if vocab and accuracies and max(accuracies) < 2.0 / vocab:
        return (
            f"held-out accuracy at chance (below 2 / vocab_size = {2.0 / vocab:.3f}): the members have "
            "not learned the task, differences do not say what heads can do"
        )
    return ""


def _usable(m: dict, sums) -> bool:
    return sums is not None and m.get("status", "ok") not in ("diverged", STOPPED)


def comparisons(members: list[dict], read, fields, tuned=(), baselines=None, vocab=None) -> list[dict]:
    """results.json's ``comparisons`` (module docstring) from its ``members``; ``read(name)``: a
    member's test window sums (2, N) or a file of W/eval_windows (``<task>.clusters``), None if
    absent; ``fields``: the swept fields; ``baselines``: results.json's, by task."""
    keys = group_fields(fields, tuned)
    grid = [sorted({m.get(a) for m in members if m.get(a) is not None}) for a in tuned]
    validated = any(m.get("val_loss") is not None for m in members)
    sums = {m["name"]: read(m["name"]) for m in members}
    out = []
    for group, by_heads in sorted(cells(members, keys, tuned).items(), key=lambda kv: str(kv[0])):
        label = dict(zip(keys, group))
        chosen = {}  # heads -> (setting, {seed: member})
        for heads, settings in sorted(by_heads.items(), key=lambda kv: kv[0] if kv[0] is not None else -1):
            if tuned and validated:
                setting = select(
                    settings,
                    lambda i: members[i].get("val_loss") if _usable(members[i], sums[members[i]["name"]]) else None,
                )
            elif tuned:
                setting = None
            else:
                setting = next(iter(settings))
            if setting is not None:
                seeds = {
                    members[i].get("seed"): members[i]
                    for i in settings[setting]
                    if _usable(members[i], sums[members[i]["name"]])
                }
                if seeds:
                    chosen[heads] = (setting, seeds)
        if not chosen:
            if tuned:
                why = f"{OLD}: nothing to select on" if not validated else "no member scored"
                out += [
                    {
                        "group": label,
                        "heads": h,
                        "selected": None,
                        "test_loss": None,
                        "difference": None,
                        "difference_interval": None,
                        "per_seed_differences": [],
                        "verdict": "-",
                        "seeds": 0,
                        "note": why,
                    }
                    for h in sorted(by_heads, key=lambda h: h if h is not None else -1)
                ]
            continue
        task = label.get("task") or next(iter(next(iter(chosen.values()))[1].values())).get("task")
        clusters = read(f"{task}.clusters") if task is not None else None
        smallest = min(chosen)
        ref_setting, ref = chosen[smallest]
        entries, losses, accuracies = [], {}, []
        for heads, (setting, seeds) in sorted(chosen.items()):
            own_sets = {m.get("eval_set") for m in seeds.values()}
            own_clusters = clusters if len(own_sets) == 1 and _fits(clusters, sums, seeds.values()) else None
            own = paired.combine([sums[m["name"]] for m in seeds.values()], len(own_sets) == 1, own_clusters)
            losses[heads] = own.mean
            accuracies += [m["eval_accuracy"] for m in seeds.values() if m.get("eval_accuracy") is not None]
            pairs = [
                (seeds[s], ref[s]) for s in seeds if s in ref and seeds[s].get("eval_set") == ref[s].get("eval_set")
            ]
            entry = {
                "group": label,
                "heads": heads,
                "selected": dict(zip(tuned, setting)),
                "val_loss": _mean([m.get("val_loss") for m in seeds.values()]),
                # the settings halving stopped (train/halving.py): left out of the selection, named
                **_stopped(members, by_heads[heads]),
                "test_loss": own.mean,
                "test_loss_se": own.se,
                "test_loss_sd_seeds": own.sd_seeds,
            }
            notes = _edge_notes(tuned, setting, grid) if tuned else []
            if heads == smallest:
                entry.update(
                    difference=0.0,
                    difference_interval=None,
                    per_seed_differences=[],
                    verdict="reference",
                    seeds=len(seeds),
                )
            elif pairs:
                diffs = [np.stack([sums[a["name"]][0] - sums[b["name"]][0], sums[a["name"]][1]]) for a, b in pairs]
                shared = len({a.get("eval_set") for a, _ in pairs}) == 1
                c = paired.compare(
                    diffs, shared, clusters if shared and _fits(clusters, sums, [a for a, _ in pairs]) else None
                )
                interval = [c.interval[0], c.interval[1]] if math.isfinite(c.interval[0]) else None
                entry.update(
                    difference=c.mean,
                    difference_interval=interval,
                    per_seed_differences=[
                        {"seed": a.get("seed"), "difference": d} for (a, _), d in zip(pairs, c.per_seed)
                    ],
                    verdict=paired.verdict(c.interval),
                    seeds=len(pairs),
                    clusters=c.clusters,
                )
            else:
                entry.update(
                    difference=None, difference_interval=None, per_seed_differences=[], verdict="unpaired", seeds=0
                )
            entry["note"] = "; ".join(notes)
            entries.append(entry)
        note = baseline_note(losses, (baselines or {}).get(task), accuracies, vocab)
        if not validated:
            note = "; ".join(filter(None, [OLD, note]))
        for entry in entries:
            entry["note"] = "; ".join(filter(None, [entry["note"], note]))
        out += entries
    return out


def _stopped(members: list[dict], settings: dict) -> dict:
    names = [members[i]["name"] for s in settings.values() for i in s if members[i].get("status") == STOPPED]
    return {"stopped_by_halving": names} if names else {}


def _fits(clusters, sums, members) -> bool:
    """Whether the recorded clusters label these members' windows (one id per window)."""
    if clusters is None:
        return False
    return all(sums[m["name"]].shape[1] == np.asarray(clusters).size for m in members)


def _mean(values):
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def results_comparisons(payload: dict, workdir) -> dict:
    """{"comparisons": [...]} for results.json (io/results_files.write's ``summary``); {} where no
    member has per-window sums."""
    config = workdir.config()
    found = comparisons(
        payload["members"],
        workdir.window_sums,
        workdir.sweep_fields(),
        tuned_axes(config),
        payload.get("baselines"),
        (config.get("model") or {}).get("vocab_size"),
    )
    return {"comparisons": found} if found else {}


def expected_best(values, n: int) -> float:
    """The expected lowest of ``n`` values drawn uniformly with replacement from ``values`` (the
    grid's mean validation losses): Dodge et al. 2019, "Show Your Work", eq. 1, for a minimum:
    sum_i v_(i) [((N - i + 1) / N)^n - ((N - i) / N)^n], v ascending."""
    v = np.sort(np.asarray(values, np.float64))
    big = v.size
    above = ((big - np.arange(big)) / big) ** n  # P(min >= v_(i)), i = 1..N
    return float((v * (above - np.append(above[1:], 0.0))).sum())


def budget_curves(members: list[dict], fields, tuned) -> dict:
    """{group: {heads: [expected best validation loss for n = 1..N]}}: over the grid of ``tuned``
    settings, each setting's mean validation loss over its seeds (settings with an unscored or
    diverged seed left out)."""
    out: dict = defaultdict(dict)
    for group, by_heads in cells(members, group_fields(fields, tuned), tuned).items():
        for heads, settings in by_heads.items():
            means = []
            for indices in settings.values():
                values = [members[i].get("val_loss") for i in indices]
                ok = all(
                    v is not None and math.isfinite(v) and members[i].get("status") != "diverged"
                    for i, v in zip(indices, values)
                )
                means += [float(np.mean(values))] if ok and values else []
            if means:
                out[group][heads] = [expected_best(means, n) for n in range(1, len(means) + 1)]
    return dict(out)
