"""results.md's, report.md's and the console's table of head counts against the sweep's smallest
(analysis/comparisons.py's ``comparisons``): per comparison group (task and every swept field but
heads, the seed and the tuned axes), each head count at its selected setting (``compare.tune``:
the lowest mean validation loss), its test loss with its standard error, and its difference to
the smallest head count on the test set, paired by seed and window, with its 95 % interval, the
per-seed differences and a verdict (analysis/paired.py). Text members' losses in bits per byte
(per token for a .bin), others' in nats. Reads each member's per-window sums (W/eval_windows,
io/window_files.py); no table where a workdir has none (trained before they were kept)."""

from __future__ import annotations

import json
import math
from collections import defaultdict

from mhjax.analysis.comparisons import comparisons as compute
from mhjax.analysis.comparisons import tuned_axes
from mhjax.analysis.paired import RECOMMENDED_SEEDS, t_quantile
from mhjax.io.results import number_text

TITLE = "Head counts against the smallest, paired on the same held-out windows"
TUNED_TITLE = "Head counts at their best settings: selected on validation, compared on test"


def unit_of(members: list[dict]) -> tuple[str, float]:
    formats = {m.get("text_format") for m in members}
    if formats == {"bytes"}:
        return "bits/byte", 1 / math.log(2)
    if formats == {"uint16"}:
        return "bits/token", 1 / math.log(2)
    return "nats", 1.0


def _num(value, scale: float, sign: bool = False) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return number_text(value * scale, "{:+.4f}" if sign else "{:.4f}")


def _interval(entry: dict, scale: float) -> str:
    diff, interval = entry.get("difference"), entry.get("difference_interval")
    if entry.get("verdict") == "reference":
        return "reference"
    if diff is None:
        return entry.get("verdict") or "-"
    text = _num(diff, scale, sign=True)
    if interval:
        text += f" [{_num(interval[0], scale, True)}, {_num(interval[1], scale, True)}]"
    return text


def _per_seed(entry: dict, scale: float) -> str:
    return ", ".join(_num(d["difference"], scale, sign=True) for d in entry.get("per_seed_differences") or [])


def _label(group: dict) -> str:
    return ", ".join(f"{k} {v}" if k != "task" else str(v) for k, v in group.items()) or "all members"


def group_table(entries: list[dict], unit: str, scale: float, tuned=()) -> list[str]:
    """One group's Markdown table (and its note under it)."""
    smallest = next((e["heads"] for e in entries if e.get("verdict") == "reference"), entries[0]["heads"])
    ses = [e.get("test_loss_se") for e in entries]
    constant = all(se is None or not math.isfinite(se) or se == 0 for se in ses)
    loss_head = f"test loss ({unit})" + ("" if constant else " ± SE")
    head = ["heads", "seeds", *(f"selected {a}" for a in tuned)]
    head += [f"validation loss ({unit})"] if tuned else []
    head += [loss_head, f"minus {smallest} head(s), paired: mean [95 % interval]", "per-seed differences", "verdict"]
    rows = []
    for e in entries:
        loss = _num(e.get("test_loss"), scale)
        se = e.get("test_loss_se")
        if se is not None and math.isfinite(se) and se > 0:  # a constant cell drops its ±
            loss += f" ± {_num(e['test_loss_se'], scale)}"
        selected = e.get("selected") or {}
        cells = [str(e["heads"]), str(e.get("seeds", "")), *(f"{selected.get(a, '-')}" for a in tuned)]
        cells += [_num(e.get("val_loss"), scale)] if tuned else []
        verdict = "" if e.get("verdict") == "reference" else e.get("verdict", "")
        cells += [loss, _interval(e, scale), _per_seed(e, scale), verdict]
        rows.append(cells)
    notes = dict.fromkeys(e["note"] for e in entries if e.get("note"))
    return [
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---:" if i < len(head) - 2 else "---" for i in range(len(head))) + "|",
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
        *(f"Note ({_heads_with(entries, n)}): {n}." for n in notes),
        *([""] if notes else []),
    ]


def _heads_with(entries, note) -> str:
    heads = [str(e["heads"]) for e in entries if e.get("note") == note]
    return "every head count" if len(heads) == len(entries) else "heads " + ", ".join(heads)


def baseline_line(baseline: dict | None) -> list[str]:
    """The n-gram baselines of a text task (results.json ``baselines``) as a line under its table."""
    if not baseline:
        return []
    cells = []
    for name in ("unigram", "bigram", "trigram"):
        if baseline.get(f"{name}_bits") is not None:
            se = baseline.get(f"{name}_bits_se")
            cells.append(f"{name} {baseline[f'{name}_bits']:.4f}" + (f" ± {se:.4f} SE" if se else ""))
    b = baseline
    entropy = b.get("heldout_unigram_entropy_bits", float("nan"))
    clusters = f" in {b['clusters']} clusters ({b.get('cluster')})" if b.get("clusters") else ""
    return [
        f"Baselines on the same {b.get('windows')} test windows{clusters} ({b.get('unit')}; {b.get('smoothing')}): "
        + ", ".join(cells)
        + f"; the held-out tokens' own unigram entropy {entropy:.4f}.",
        "",
    ]


def rule_lines(entries: list[dict], tuned=()) -> list[str]:
    """How to read the tables, and the seed count's warning where few seeds leave no verdict."""
    seeds = sorted({e.get("seeds") for e in entries if e.get("verdict") not in ("reference", None)} - {0, None})
    how = (
        "Per seed, the difference of the mean test loss to the smallest head count, window by window on the same "
        "windows; the mean over seeds with a 95 % interval from Student's t at seeds - 1 degrees of freedom on "
        "the per-seed differences, widened by the windows' clustered SE where every seed scored the same windows "
        "(mhjax/analysis/paired.py). Lower / higher: the interval excludes 0; within noise: it holds 0. "
        "Test loss ± SE: one standard error of the mean over seeds."
    )
    if tuned:
        how = (
            f"Per head count, the {' and '.join(tuned)} with the lowest mean validation loss over seeds is selected "
            "(the validation windows are apart from the test windows: experiments/heldout_sets.py); head counts are "
            "compared on the test set at their selections. " + how
        )
    out = [how, ""]
    few = [s for s in seeds if s < RECOMMENDED_SEEDS]
    if few:
        quant = ", ".join(f"t({s - 1}) = {t_quantile(s - 1):.2f}" for s in few if s > 1)
        out += [
            f"Seeds: {', '.join(map(str, few))} paired seed(s) here ({quant or 'one seed: no interval'}); a difference "
            f'must exceed that many SEs to get a verdict, so with fewer seeds most verdicts are "within noise". '
            f"{RECOMMENDED_SEEDS} seeds or more recommended (t(4) = {t_quantile(4):.2f}).",
            "",
        ]
    return out


def render(entries: list[dict], members: list[dict], tuned=(), baselines=None) -> str:
    """The Markdown section of ``entries`` (results.json ``comparisons``); "" without any."""
    if not entries:
        return ""
    tuned = tuple(tuned) or tuple(dict.fromkeys(k for e in entries for k in (e.get("selected") or {})))
    by_group: dict = defaultdict(list)
    for e in entries:  # keyed by JSON: a group's values may be dicts (task_params)
        by_group[json.dumps(e.get("group", {}), sort_keys=True, default=str)].append(e)
    out = []
    for group_entries in by_group.values():
        task = group_entries[0].get("group", {}).get("task")
        unit, scale = unit_of([m for m in members if task is None or m.get("task") == task])
        out += [
            f"**{_label(group_entries[0].get('group', {}))}** ({unit})",
            "",
            *group_table(group_entries, unit, scale, tuned),
            *baseline_line((baselines or {}).get(task)),
        ]
    title = TUNED_TITLE if tuned else TITLE
    return "\n".join([f"## {title}", "", *rule_lines(entries, tuned), *out])


def paired_tables(members, read, sweep_fields=None, baselines=None, tuned=(), vocab=None, found=None) -> str:
    """The Markdown section (empty when no member has per-window sums). ``read(name)``: a member's
    (2, N) per-window sums or a file of W/eval_windows, None if absent (Workdir.window_sums);
    ``found``: results.json's ``comparisons`` where it has them (else computed)."""
    if found is None:
        found = compute(members, read, sweep_fields or ("task", "heads"), tuned, baselines, vocab)
    return render(found, members, tuned, baselines)


def results_tables(payload: dict, workdir) -> str:
    """results.md's section (Workdir.write_results's ``tables``)."""
    config = workdir.config()
    return paired_tables(
        payload["members"],
        workdir.window_sums,
        workdir.sweep_fields(),
        payload.get("baselines"),
        tuned_axes(config),
        (config.get("model") or {}).get("vocab_size"),
        payload.get("comparisons"),
    )


def console_lines(payload: dict) -> list[str]:
    """The console's closing lines of results.json's ``comparisons``: per group, each head count's
    selection, test loss, paired difference with its 95 % interval and per-seed differences, verdict."""
    entries = payload.get("comparisons") or []
    by_group: dict = defaultdict(list)
    for e in entries:
        by_group[tuple(sorted((e.get("group") or {}).items(), key=str))].append(e)
    out = []
    for group, group_entries in by_group.items():
        task = dict(group).get("task")
        unit, scale = unit_of([m for m in payload.get("members", []) if task is None or m.get("task") == task])
        tuned = any(e.get("selected") for e in group_entries)
        how = "selected on validation, compared on test" if tuned else "on the test set"
        out.append(f"head counts, {_label(dict(group))} ({unit}; {how}; difference to the smallest [95 % interval]):")
        for e in group_entries:
            selected = "".join(f" {k}={v}" for k, v in (e.get("selected") or {}).items())
            seeds = _per_seed(e, scale)
            verdict = "" if e.get("verdict") == "reference" else f" {e.get('verdict')}"
            out.append(
                f"  heads {e['heads']}{selected}: test {_num(e.get('test_loss'), scale)}, {_interval(e, scale)}"
                + (f" (per seed {seeds})" if seeds else "")
                + verdict
            )
        for note in dict.fromkeys(e["note"] for e in group_entries if e.get("note")):
            out.append(f"  note ({_heads_with(group_entries, note)}): {note}")
        stopped = sum(len(e.get("stopped_by_halving") or []) for e in group_entries)
        if stopped:  # train/halving.py: never selected
            out.append(f"  stopped by halving, not selected: {stopped} members (their entries: stopped_by_halving)")
    return out
