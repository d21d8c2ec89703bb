"""results.md's and report.md's table of head counts against the sweep's smallest: per task and
architecture (and any other swept field but the seed), each head count's held-out loss with its
standard error, and its paired difference to the smallest head count over the same windows and
seeds, with its standard error and a verdict (analysis/paired.py: "within noise" where
|difference| < 2 SE). Text members' losses in bits per byte (per token for a .bin), others' in nats.
Reads each member's per-window sums (W/eval_windows, io/window_files.py); no table where a
workdir has none (trained before they were kept)."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from mhjax.analysis.paired import NOISE_SE, combine, verdict
from mhjax.io.results import number_text
from mhjax.plotting.report import field_value, group_keys

TITLE = "Head counts against the smallest, paired on the same held-out windows"


def _unit(group: list[dict]) -> tuple[str, float]:
    formats = {m.get("text_format") for m in group}
    if formats == {"bytes"}:
        return "bits/byte", 1 / math.log(2)
    if formats == {"uint16"}:
        return "bits/token", 1 / math.log(2)
    return "nats", 1.0


def _cell(mean: float, se: float, scale: float, sign: bool = False) -> str:
    if not math.isfinite(mean):
        return "-"
    text = number_text(mean * scale, "{:+.4f}" if sign else "{:.4f}")
    return f"{text} ± {number_text(se * scale, '{:.4f}')}" if math.isfinite(se) else text


def _rows(group: list[dict], read, scale: float) -> list[list[str]]:
    by_heads: dict = defaultdict(dict)  # {heads: {seed: (member, sums)}}
    for m in group:
        sums = read(m["name"])
        if sums is not None and m.get("status", "ok") != "diverged":
            by_heads[m.get("heads")][m.get("seed")] = (m, np.asarray(sums, np.float64))
    if not by_heads:
        return []
    by_heads = dict(sorted(by_heads.items()))
    smallest = next(iter(by_heads))
    rows = []
    for heads, seeds in by_heads.items():
        own = combine([s for _, s in seeds.values()], len({m.get("eval_set") for m, _ in seeds.values()}) == 1)
        pairs = [
            (seeds[s], by_heads[smallest][s])
            for s in seeds
            if s in by_heads[smallest] and seeds[s][0].get("eval_set") == by_heads[smallest][s][0].get("eval_set")
        ]
        cells = [str(heads), str(len(seeds)), _cell(own.mean, own.se, scale)]
        if heads == smallest:
            cells += ["reference", ""]
        elif pairs:
            diffs = [np.stack([a[1][0] - b[1][0], a[1][1]]) for a, b in pairs]
            shared = len({a[0].get("eval_set") for a, _ in pairs}) == 1
            d = combine(diffs, shared)
            note = "" if len(pairs) == len(seeds) else f" ({len(pairs)} seeds)"
            cells += [_cell(d.mean, d.se, scale, sign=True) + note, verdict(d.mean, d.se)]
        else:
            cells += ["unpaired", ""]
        rows.append(cells)
    return rows


def baseline_line(baseline: dict | None) -> list[str]:
    """The n-gram baselines of a text task (results.json ``baselines``) as a line under its table."""
    if not baseline:
        return []
    cells = [
        f"{name} {_cell(baseline[f'{name}_bits'], baseline.get(f'{name}_bits_se') or float('nan'), 1.0)}"
        for name in ("unigram", "bigram", "trigram")
        if baseline.get(f"{name}_bits") is not None
    ]
    b = baseline
    entropy = b.get("heldout_unigram_entropy_bits", float("nan"))
    return [
        f"Baselines on the same {b.get('windows')} windows ({b.get('unit')}; {b.get('smoothing')}): "
        + ", ".join(cells)
        + f"; the held-out tokens' own unigram entropy {entropy:.4f}.",
        "",
    ]


def paired_tables(members: list[dict], read, sweep_fields=None, baselines=None) -> str:
    """The Markdown section (empty when no member has per-window sums). ``read(name)``: a member's
    (2, N) per-window sums or None (Workdir.window_sums); ``baselines``: results.json's, by task."""
    keys = [k for k in group_keys(members, sweep_fields) if k != "heads"]
    groups: dict = defaultdict(list)
    for m in members:
        groups[tuple(field_value(m, k) for k in keys)].append(m)
    out = []
    for values, group in sorted(groups.items(), key=lambda kv: str(kv[0])):
        unit, scale = _unit(group)
        rows = _rows(group, read, scale)
        if not rows:
            continue
        label = ", ".join(f"{k} {v}" if k != "task" else str(v) for k, v in zip(keys, values)) or "all members"
        smallest = rows[0][0]
        out += [
            f"**{label}** (held-out loss in {unit})",
            "",
            f"| heads | seeds | held-out loss ({unit}) ± SE | minus {smallest} head(s), paired ± SE | verdict |",
            "|---:|---:|---:|---:|---|",
            *("| " + " | ".join(r) + " |" for r in rows),
            "",
            *baseline_line((baselines or {}).get(group[0].get("task"))),
        ]
    if not out:
        return ""
    rule = (
        f"Each head count's held-out loss (mean over seeds ± one standard error) and its difference to the smallest "
        f"head count, window by window on the same held-out windows and seed by seed; the standard error combines the "
        f"windows' and the seeds' spread (mhjax/analysis/paired.py). Within noise: |difference| < {NOISE_SE:g} SE; "
        "lower / higher: a lower / higher held-out loss than the smallest head count, beyond the noise."
    )
    return "\n".join([f"## {TITLE}", "", rule, "", *out])


def results_tables(payload: dict, workdir) -> str:
    """results.md's section (Workdir.write_results's ``tables``)."""
    return paired_tables(payload["members"], workdir.window_sums, workdir.sweep_fields(), payload.get("baselines"))
